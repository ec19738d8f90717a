#include "memfit/kernels/cpu/fill.h"

#include <cstring>

#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/kernel_times.h"

namespace memfit::kernels {

void zero(Tensor& t) {
  if (t.nbytes() == 0) return;
  KernelScope timed("zero");
  // In floats' worth of bytes, so that the grain means what it means for the other kernels.
  char* p = static_cast<char*>(t.raw_data());
  const int64_t n = static_cast<int64_t>(t.nbytes());
  const int64_t floats = n / 4;
  parallel_ranges(floats, [&](int64_t begin, int64_t end) {
    std::memset(p + begin * 4, 0, static_cast<size_t>(end - begin) * 4);
  });
  if (const int64_t tail = n - floats * 4; tail > 0) std::memset(p + floats * 4, 0, tail);
}

}  // namespace memfit::kernels
