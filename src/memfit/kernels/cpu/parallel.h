// OpenMP helpers shared by the element-wise kernels: split a flat range into blocks whose
// starts are multiples of 16 floats (so vector loops see whole vectors except at the very end)
// and run them on the team, staying on one thread when the range is too small to pay for waking
// the others. Reductions go through per-thread partials summed in thread order, so a result
// does not depend on which thread finished first.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace memfit::kernels {

// Below this many elements a kernel runs on the calling thread: waking the team costs more than
// it saves (and much more when the cores are shared). The one threshold of kernels/cpu: the
// element-wise kernels, the row kernels (LayerNorm, cross-entropy, embedding, column sums;
// counted in elements of the whole tensor) and the optimizer and 8-bit quantisation loops,
// which had 8192, 32768 and 65536 of their own before.
inline constexpr int64_t kParallelGrain = 16384;

// Calls fn(begin, end) on disjoint ranges covering [0, n): one contiguous range per thread,
// each starting at a multiple of 16.
template <typename Fn>
void parallel_ranges(int64_t n, Fn&& fn) {
  if (n <= 0) return;
#pragma omp parallel if (n > kParallelGrain)
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t vecs = (n + 15) / 16;
    const int64_t begin = std::min(n, vecs * tid / nth * 16);
    const int64_t end = std::min(n, vecs * (tid + 1) / nth * 16);
    if (begin < end) fn(begin, end);
  }
}

// Sum over threads of fn(begin, end) -> double on the ranges of parallel_ranges, added in
// thread order.
template <typename Fn>
double parallel_sum(int64_t n, Fn&& fn) {
  if (n <= 0) return 0.0;
  std::vector<double> partial(static_cast<size_t>(omp_get_max_threads()), 0.0);
#pragma omp parallel if (n > kParallelGrain)
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t vecs = (n + 15) / 16;
    const int64_t begin = std::min(n, vecs * tid / nth * 16);
    const int64_t end = std::min(n, vecs * (tid + 1) / nth * 16);
    if (begin < end) partial[static_cast<size_t>(tid)] = fn(begin, end);
  }
  double total = 0.0;
  for (double p : partial) total += p;
  return total;
}

}  // namespace memfit::kernels
