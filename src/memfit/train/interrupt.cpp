#include "memfit/train/interrupt.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>

#include "memfit/core/error.h"

namespace memfit {
namespace {

// Lock-free, so async-signal-safe; atomic because the two signals may land on two threads (the
// OpenMP workers take signals too) at the same moment.
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

}  // namespace

InterruptScope::InterruptScope() {
  MEMFIT_CHECK(!g_active.exchange(true), "train", "one InterruptScope at a time");
  g_signal = 0;
  struct sigaction sa = {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // a read or write in progress goes on; the loop polls the flag
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

InterruptScope::~InterruptScope() {
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
