// InterruptScope's threads (Note [Signals on their own thread]): while it lives, the caller and
// every OpenMP thread block SIGINT and SIGTERM, so a signal runs its handler on the scope's own
// thread, never in the middle of a GEMM; after it, the caller's mask is as before. The signals'
// effect on a run (stop after the step, save, exit code) is tested on the binary in
// tests/cli/interrupt_test.cpp.
#include "memfit/train/interrupt.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <vector>

namespace memfit {
namespace {

bool blocked_here(int sig) {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  return sigismember(&now, sig) == 1;
}

TEST(InterruptScope, ComputingThreadsBlockTheSignalsAndTheCallerGetsItsMaskBack) {
  ASSERT_FALSE(blocked_here(SIGINT));
  ASSERT_FALSE(blocked_here(SIGTERM));
  const int threads = omp_get_max_threads();
  {
    const InterruptScope scope;
    std::vector<int> blocked(threads, 0);
#pragma omp parallel num_threads(threads)
    blocked[omp_get_thread_num()] = blocked_here(SIGINT) && blocked_here(SIGTERM);
    for (int t = 0; t < threads; ++t) EXPECT_TRUE(blocked[t]) << "OpenMP thread " << t;
  }
  EXPECT_FALSE(blocked_here(SIGINT));
  EXPECT_FALSE(blocked_here(SIGTERM));
}

TEST(InterruptScope, ASignalSetsTheFlagOnItsOwnThread) {
  const InterruptScope scope;
  EXPECT_EQ(interrupt_signal(), 0);
  // Process-directed, as kill(1) sends it: only the scope's thread has it open.
  ASSERT_EQ(kill(getpid(), SIGTERM), 0);
  for (int i = 0; i < 2000 && interrupt_signal() == 0; ++i) usleep(1000);
  EXPECT_EQ(interrupt_signal(), SIGTERM);
}

}  // namespace
}  // namespace memfit
