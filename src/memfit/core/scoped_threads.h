// OpenMP's thread count for one scope: --threads applies to the planning (plan_training) and
// to the run (train()) that asked for it, and the process's own count is back afterwards, so a
// caller that plans or trains more than once (the tests, a search) is not left with another's.
#pragma once

#include <omp.h>

namespace memfit {

// The most threads --threads takes. OpenMP's threads are operating-system threads, each with
// its own stack and a slice of the per-thread workspaces: libgomp fails to create tens of
// thousands (and crashed at 100,000), and far fewer already exceed any machine's cores.
inline constexpr int kMaxThreads = 1024;

// Sets OpenMP's thread count for the scope (0: leave it), restoring the previous one after.
class ScopedThreads {
 public:
  explicit ScopedThreads(int threads) : before_(omp_get_max_threads()) {
    if (threads > 0) omp_set_num_threads(threads);
  }
  ~ScopedThreads() { omp_set_num_threads(before_); }
  ScopedThreads(const ScopedThreads&) = delete;
  ScopedThreads& operator=(const ScopedThreads&) = delete;

 private:
  int before_;
};

}  // namespace memfit
