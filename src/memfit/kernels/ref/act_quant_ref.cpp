// Reference activation compression, one value at a time (see act_quant_ref.h).
#include "memfit/kernels/ref/act_quant_ref.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "memfit/kernels/cpu/act_quant.h"

namespace memfit::kernels::ref {

void act_quantize_ref(const float* x, int64_t n, bool fp8, uint8_t* codes, float* scales) {
  const float qmax = fp8 ? kFp8Max : kInt8Max;
  for (int64_t b = 0; b < act_blocks(n); ++b) {
    const int64_t begin = b * kActBlock, end = std::min(n, begin + kActBlock);
    float absmax = 0.0f;
    bool finite = true;
    for (int64_t i = begin; i < end; ++i) {
      finite = finite && std::isfinite(x[i]);
      absmax = std::max(absmax, std::fabs(x[i]));
    }
    if (!finite) {
      scales[b] = std::numeric_limits<float>::quiet_NaN();
      std::fill(codes + begin, codes + end, uint8_t{0});
      continue;
    }
    if (absmax > 0.0f) absmax = std::max(absmax, kActMinAbsmax);
    scales[b] = absmax / qmax;
    const float inv = absmax > 0.0f ? qmax / absmax : 0.0f;
    for (int64_t i = begin; i < end; ++i) {
      const float y = std::min(std::max(x[i] * inv, -qmax), qmax);
      codes[i] = fp8 ? fp8_e4m3_from_f32(y)
                     : static_cast<uint8_t>(static_cast<int8_t>(std::nearbyint(y)));
    }
  }
}

void act_dequantize_ref(const uint8_t* codes, const float* scales, int64_t n, bool fp8,
                        float* x) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = fp8 ? f32_from_fp8_e4m3(codes[i])
                        : static_cast<float>(static_cast<int8_t>(codes[i]));
    x[i] = v * scales[i / kActBlock];
  }
}

}  // namespace memfit::kernels::ref
