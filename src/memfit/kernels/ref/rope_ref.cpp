// Reference RoPE: the formulas of cpu/rope.h in double, without transformers' f32 steps.
#include "memfit/kernels/ref/rope_ref.h"

#include <cmath>
#include <numbers>

namespace memfit::kernels::ref {

void rope_inv_freq_ref(double* inv_freq, int64_t hs, double theta, double factor, double low,
                       double high, double old_len) {
  for (int64_t i = 0; i < hs / 2; ++i) {
    const double f = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hs));
    double g = f;
    if (factor > 0) {
      const double wavelen = 2.0 * std::numbers::pi / f;
      if (wavelen > old_len / low) {
        g = f / factor;
      } else if (wavelen >= old_len / high) {  // between the bands: interpolate
        const double smooth = (old_len / wavelen - low) / (high - low);
        g = (1.0 - smooth) * f / factor + smooth * f;
      }
    }
    inv_freq[i] = g;
  }
}

void rope_table_ref(double* table, const double* inv_freq, int64_t T, int64_t hs) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < hs / 2; ++i) {
      table[t * hs + i] = std::cos(static_cast<double>(t) * inv_freq[i]);
      table[t * hs + hs / 2 + i] = std::sin(static_cast<double>(t) * inv_freq[i]);
    }
}

namespace {

// sign +1: forward rotation; -1: the transposed one.
void rotate(double* qkv, const double* table, int64_t B, int64_t T, int64_t q_heads,
            int64_t kv_heads, int64_t hs, double sign) {
  const int64_t width = (q_heads + 2 * kv_heads) * hs, h2 = hs / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t)
      for (int64_t h = 0; h < q_heads + kv_heads; ++h) {
        double* x = qkv + (b * T + t) * width + h * hs;
        const double* c = table + t * hs;
        for (int64_t i = 0; i < h2; ++i) {
          const double s = sign * c[h2 + i], x1 = x[i], x2 = x[h2 + i];
          x[i] = x1 * c[i] - x2 * s;
          x[h2 + i] = x2 * c[i] + x1 * s;
        }
      }
}

}  // namespace

void rope_forward_ref(double* qkv, const double* table, int64_t B, int64_t T, int64_t q_heads,
                      int64_t kv_heads, int64_t hs) {
  rotate(qkv, table, B, T, q_heads, kv_heads, hs, 1.0);
}

void rope_backward_ref(double* dqkv, const double* table, int64_t B, int64_t T, int64_t q_heads,
                       int64_t kv_heads, int64_t hs) {
  rotate(dqkv, table, B, T, q_heads, kv_heads, hs, -1.0);
}

}  // namespace memfit::kernels::ref
