// bf16 gradient sums' check (bf16_check.h).
#include "memfit/kernels/cpu/bf16_check.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "memfit/core/dtype.h"

namespace memfit::kernels {

UnscaleResult unscale_and_check_bf16(uint16_t* x, int64_t n, std::optional<float> inv_scale) {
  constexpr int64_t kChunk = int64_t{1} << 16;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
  const bool unscale = inv_scale.has_value();
  const float inv = inv_scale.value_or(1.0f);
  std::vector<double> partial(static_cast<size_t>(chunks), 0.0);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    double s = 0;
    for (int64_t i = c * kChunk, e = std::min(n, i + kChunk); i < e; ++i) {
      float v = f32_from_bf16(x[i]);
      if (unscale) {
        v *= inv;
        x[i] = bf16_from_f32(v);
        v = f32_from_bf16(x[i]);
      }
      s += static_cast<double>(v) * v;
    }
    partial[static_cast<size_t>(c)] = s;
  }
  double sum = 0;
  for (double p : partial) sum += p;
  return {std::isfinite(sum), sum};
}

}  // namespace memfit::kernels
