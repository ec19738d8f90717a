// Note [Kernel times] (docs/notes/memory-profile.md): where a step's time goes, kernel by
// kernel. Off by default; `memfit train --profile` turns it on for the profiled steps and
// summary.json lists the totals. Each public kernel opens a KernelScope: on, it adds the call's
// wall time to its name's total (a GEMM's name carries its types and shape, and its FLOPs give a
// rate), as *self* time, so a kernel that calls another (a widened matmul's conversions, a GEMM
// inside a matmul) is not counted twice and the totals add up to the time spent in kernels.
// Only the calling thread's outermost kernels time themselves: a kernel called inside another's
// parallel region (OpenMP) is part of that one. Off, a scope costs one relaxed load; on, two
// clock reads and a map update under a lock.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace memfit::kernels {

// Turns the recording on or off; the totals stay until reset_kernel_times().
void record_kernel_times(bool on);
bool kernel_times_on();
void reset_kernel_times();

struct KernelTime {
  std::string name;
  int64_t calls = 0;
  double seconds = 0;  // self time: the kernels it called are their own entries
  double flops = 0;    // where the kernel states them (GEMMs), else 0
};
// The totals since the last reset, the most time first.
std::vector<KernelTime> kernel_times();

class KernelScope {
 public:
  // `name` must outlive the scope (a string literal); the string form is for names built per
  // call (a GEMM's shape), which callers build only when kernel_times_on().
  explicit KernelScope(const char* name, double flops = 0);
  KernelScope(std::string name, double flops);
  ~KernelScope();
  KernelScope(const KernelScope&) = delete;
  KernelScope& operator=(const KernelScope&) = delete;

 private:
  void open();
  const char* name_ = nullptr;
  std::string owned_;
  double flops_ = 0;
  bool active_ = false;
  int64_t start_ns_ = 0;
  int64_t children_ns_ = 0;
  KernelScope* parent_ = nullptr;
};

}  // namespace memfit::kernels
