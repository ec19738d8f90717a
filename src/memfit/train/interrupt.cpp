#include "memfit/train/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <omp.h>
#include <pthread.h>

#include <atomic>

#include "memfit/core/error.h"

namespace memfit {
namespace {

// Lock-free, so async-signal-safe; atomic because a second signal may land while the first's
// handler runs.
std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);
struct sigaction g_old_int, g_old_term;
std::atomic<bool> g_active{false};

// Async-signal-safe: a flag, a write(2) and _exit only.
void on_signal(int sig) {
  int none = 0;  // the second: at once, nothing half-written remains
  if (!g_signal.compare_exchange_strong(none, sig)) _exit(128 + sig);
  static const char msg[] =
      "\nmemfit: stopping after this step (saving if --save was given); signal again to exit "
      "now\n";
  [[maybe_unused]] ssize_t n = write(STDERR_FILENO, msg, sizeof msg - 1);
}

sigset_t interrupt_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  return set;
}

}  // namespace

// Note [Signals on their own thread]: a handler runs on the stack of the thread the signal
// lands on, below that thread's stack pointer. oneDNN 2.6's GEMM-based f32 kernel (gemm:jit,
// which memfit uses: Note [GEMM kernel]) evidently keeps live data there, beyond the 128 bytes
// the ABI leaves alone: a SIGTERM that landed in a GEMM corrupted the heap (the CLI's Interrupt
// test: "corrupted size vs. prev_size", or SIGSEGV in a later free, in 17 of 20 runs), and the
// same handler on an alternate stack (sigaltstack) made that vanish. So no computing thread takes
// these signals. The caller blocks them, and so does every OpenMP thread of its pool (threads
// it creates later inherit the mask); a thread of our own, which computes nothing, leaves them
// open and runs the handler. Threads started before the scope (MPI's, the offload engine's)
// may still take one: they run compiled code only, which respects the ABI.
InterruptScope::InterruptScope() {
  MEMFIT_CHECK(!g_active.exchange(true), "train", "one InterruptScope at a time");
  g_signal = 0;
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a read or write in progress goes on; the loop polls the flag
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
  // The receiver first, so that it starts with the signals open, then the computing threads.
  receiver_ = std::thread([this] {
    const sigset_t open = interrupt_set();
    pthread_sigmask(SIG_UNBLOCK, &open, nullptr);  // even if the caller had them blocked
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [this] { return done_; });
  });
  const sigset_t set = interrupt_set();
  pthread_sigmask(SIG_BLOCK, &set, &old_mask_);
#pragma omp parallel
  {
    if (omp_get_thread_num() != 0) pthread_sigmask(SIG_BLOCK, &set, nullptr);
  }
}

InterruptScope::~InterruptScope() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
  }
  done_cv_.notify_one();
  receiver_.join();
  // A signal that arrives from here on is taken by the caller, under the old handlers. The
  // OpenMP threads keep the signals blocked: the caller takes them.
  pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
  g_active = false;
}

int interrupt_signal() { return g_signal.load(); }

std::string_view signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    default: return "a signal";
  }
}

}  // namespace memfit
