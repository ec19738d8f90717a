// The NF4 reference: one loop per step of bitsandbytes' algorithm, no vectors, no threads.
#include "memfit/kernels/ref/nf4_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/kernels/cpu/blockwise_quant.h"
#include "memfit/kernels/ref/matmul_ref.h"

namespace memfit::kernels::ref {

void nf4_quantize(const float* x, Nf4Weight& w) {
  const int64_t n = w.numel(), blocks = w.blocks();
  std::vector<float> absmax(static_cast<size_t>(blocks));
  std::vector<uint8_t> code(static_cast<size_t>(blocks * kNf4Block));
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t e0 = b * kNf4Block, e1 = std::min(n, e0 + kNf4Block);
    float m = 0.0f;  // the padding's zeros and any NaN change nothing
    for (int64_t e = e0; e < e1; ++e) m = std::fmax(m, std::fabs(x[e]));
    absmax[b] = m;
    const float inv = 1.0f / m;
    for (int64_t e = e0; e < e0 + kNf4Block; ++e) {
      const float scaled = (e < e1 ? x[e] : 0.0f) * inv;
      int c = 0;  // dQuantizeNF4's tree: the thresholds below the value
      for (float t : kNf4Thresholds)
        if (scaled > t) ++c;
      code[e] = static_cast<uint8_t>(c);
    }
  }
  for (int64_t i = 0; i < (n + 1) / 2; ++i)
    w.codes[i] = static_cast<uint8_t>(code[2 * i] << 4 | code[2 * i + 1]);

  double sum = 0.0;
  for (float a : absmax) sum += a;
  const float offset = static_cast<float>(sum / static_cast<double>(blocks));
  *w.offset = offset;
  const QuantMap& map = signed_dynamic_map();
  for (int64_t s = 0; s * kNf4ScaleBlock < blocks; ++s) {
    const int64_t b0 = s * kNf4ScaleBlock, b1 = std::min(blocks, b0 + kNf4ScaleBlock);
    float scale = 0.0f;
    for (int64_t b = b0; b < b1; ++b) scale = std::max(scale, std::fabs(absmax[b] - offset));
    w.scales[s] = scale;
    const float inv = 1.0f / scale;
    for (int64_t b = b0; b < b1; ++b) w.qabsmax[b] = map.nearest((absmax[b] - offset) * inv);
  }
}

void nf4_dequantize(const Nf4Weight& w, float* out, bool round_bf16) {
  const QuantMap& map = signed_dynamic_map();
  for (int64_t e = 0; e < w.numel(); ++e) {
    const int64_t b = e / kNf4Block;
    volatile float scaled = map.values[w.qabsmax[b]] * w.scales[b / kNf4ScaleBlock];  // no FMA
    const float absmax = scaled + *w.offset;
    const uint8_t byte = w.codes[e / 2];
    const int code = e % 2 == 0 ? byte >> 4 : byte & 15;
    const float v = kNf4Values[code] * absmax;
    out[e] = round_bf16 ? f32_from_bf16(bf16_from_f32(v)) : v;
  }
}

namespace {
std::vector<double> dequantized_double(const Nf4Weight& w, bool round_bf16) {
  std::vector<float> f(static_cast<size_t>(w.numel()));
  nf4_dequantize(w, f.data(), round_bf16);
  return std::vector<double>(f.begin(), f.end());
}
}  // namespace

void nf4_matmul_forward(double* out, const double* inp, const Nf4Weight& w, int64_t R,
                        bool round_bf16) {
  const std::vector<double> W = dequantized_double(w, round_bf16);
  matmul_forward(out, inp, W.data(), nullptr, R, w.cols, w.rows);
}

void nf4_matmul_backward_input(double* dinp, const double* dout, const Nf4Weight& w, int64_t R,
                               bool round_bf16) {
  const std::vector<double> W = dequantized_double(w, round_bf16);
  gemm(false, false, R, w.cols, w.rows, 1.0, dout, w.rows, W.data(), w.cols, 0.0, dinp, w.cols);
}

}  // namespace memfit::kernels::ref
