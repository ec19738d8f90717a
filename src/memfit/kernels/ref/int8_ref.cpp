// The int8 weight reference: one loop per step of the definition, no vectors, no threads.
#include "memfit/kernels/ref/int8_ref.h"

#include <cmath>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/kernels/ref/matmul_ref.h"

namespace memfit::kernels::ref {

void int8_quantize(const float* x, Int8Weight& w) {
  for (int64_t r = 0; r < w.rows; ++r) {
    const float* row = x + r * w.cols;
    float m = 0.0f;  // NaN changes nothing
    for (int64_t c = 0; c < w.cols; ++c) m = std::fmax(m, std::fabs(row[c]));
    w.absmax[r] = m;
    const float inv = 127.0f / m;  // an all-zero row: inf, and 0 * inf a NaN, code 0
    for (int64_t c = 0; c < w.cols; ++c) {
      const float s = row[c] * inv;  // clamped: it leaves [-127, 127] only where inv overflowed
      const float clamped = s < -127.0f ? -127.0f : s > 127.0f ? 127.0f : s;
      w.codes[r * w.cols + c] =
          std::isnan(s) ? int8_t{0} : static_cast<int8_t>(std::nearbyint(clamped));
    }
  }
}

void int8_dequantize(const Int8Weight& w, float* out, bool round_bf16) {
  for (int64_t e = 0; e < w.numel(); ++e) {
    const float scale = w.absmax[e / w.cols] * kInt8InvMax;
    const float v = static_cast<float>(w.codes[e]) * scale;
    out[e] = round_bf16 ? f32_from_bf16(bf16_from_f32(v)) : v;
  }
}

namespace {
std::vector<double> dequantized_double(const Int8Weight& w, bool round_bf16) {
  std::vector<float> f(static_cast<size_t>(w.numel()));
  int8_dequantize(w, f.data(), round_bf16);
  return std::vector<double>(f.begin(), f.end());
}
}  // namespace

void int8_matmul_forward(double* out, const double* inp, const Int8Weight& w, int64_t R,
                         bool round_bf16) {
  const std::vector<double> W = dequantized_double(w, round_bf16);
  matmul_forward(out, inp, W.data(), nullptr, R, w.cols, w.rows);
}

void int8_matmul_backward_input(double* dinp, const double* dout, const Int8Weight& w, int64_t R,
                                bool round_bf16) {
  const std::vector<double> W = dequantized_double(w, round_bf16);
  gemm(false, false, R, w.cols, w.rows, 1.0, dout, w.rows, W.data(), w.cols, 0.0, dinp, w.cols);
}

}  // namespace memfit::kernels::ref
