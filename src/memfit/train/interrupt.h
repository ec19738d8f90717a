// SIGINT (Ctrl-C) and SIGTERM (what Slurm and Kubernetes send before they preempt a job) while
// training: the first asks the loop to stop after the optimizer step in progress, save where
// --save is given (atomically, as every save) and exit 130 or 143; a second exits at once with
// 128 + its number, the last checkpoint intact, since no save ever overwrites one in place
// (io/checkpoint/checkpoint_dir.h). A step is the unit: a micro-batch's gradient is not saved, so
// stopping inside an accumulation would lose it anyway.
#pragma once

#include <signal.h>

#include <condition_variable>
#include <mutex>
#include <string_view>
#include <thread>

namespace memfit {

// Catches SIGINT and SIGTERM while alive, restoring the previous handlers after. One at a time.
// The signals are taken on a thread of its own, never on one that computes (Note [Signals on
// their own thread] in interrupt.cpp): the caller and its OpenMP threads block them.
class InterruptScope {
 public:
  InterruptScope();
  ~InterruptScope();
  InterruptScope(const InterruptScope&) = delete;
  InterruptScope& operator=(const InterruptScope&) = delete;

 private:
  std::thread receiver_;  // waits for the scope's end; the handler runs on it
  std::mutex mu_;
  std::condition_variable done_cv_;
  bool done_ = false;
  sigset_t old_mask_;
};

// 0, or the signal an InterruptScope caught (SIGINT or SIGTERM).
int interrupt_signal();

// "SIGINT" or "SIGTERM".
std::string_view signal_name(int sig);

}  // namespace memfit
