// How much of this machine other work is using: the CPUs kept busy by everything but this
// process (other processes, the kernel on their behalf, and a hypervisor's steal time) over an
// interval. A measurement of our own speed taken while that number is large measures the
// neighbours too: the planner's calibration (plan/calibration.h) records it and does not keep
// such a measurement once the machine is quiet (Note [Step-time model], "A busy calibration").
#pragma once

#include <chrono>

namespace memfit::cpu {

class OtherLoad {
 public:
  // Starts the interval.
  OtherLoad();
  // Average number of CPUs other work kept busy since construction (0 where /proc/stat cannot
  // be read: the machine then counts as quiet).
  double cpus() const;

 private:
  double machine_busy_s_ = -1;  // all CPUs' busy time, from /proc/stat; -1: unreadable
  double self_s_ = 0;           // this process's CPU time (all its threads)
  std::chrono::steady_clock::time_point start_;
};

// The CPUs online (where other work can run beside ours).
int online_cpus();

// Whether `other_cpus` busy beside a measurement on `threads` threads make it a measurement of
// the neighbours too: more than a tenth of the CPUs it ran on taken, after the CPUs it left idle.
bool load_disturbs(double other_cpus, int threads);

}  // namespace memfit::cpu
