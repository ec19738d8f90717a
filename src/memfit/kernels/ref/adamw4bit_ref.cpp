// Scalar 4-bit quantisation and 4-bit AdamW, one value at a time.
#include "memfit/kernels/ref/adamw4bit_ref.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "memfit/kernels/cpu/adamw8bit.h"

namespace memfit::kernels::ref {

namespace {
void set_code(uint8_t* packed, int64_t i, uint8_t c) {
  uint8_t& b = packed[i >> 1];
  b = (i & 1) ? static_cast<uint8_t>((b & 0x0f) | (c << 4)) : static_cast<uint8_t>((b & 0xf0) | c);
}
}  // namespace

float quantize_block4_ref(const float* x, int64_t n, const Quant4Map& map, uint8_t* packed) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) absmax = std::max(absmax, std::fabs(x[i]));
  const float inv = absmax > 0.0f ? 1.0f / absmax : 0.0f;
  for (int64_t i = 0; i < n; ++i) set_code(packed, i, map.nearest(x[i] * inv));
  if (n & 1) packed[n >> 1] &= 0x0f;
  return absmax;
}

void quantize_scaled4_ref(const float* x, const float* s, int64_t n, const Quant4Map& map,
                          uint8_t* packed) {
  for (int64_t i = 0; i < n; ++i)
    set_code(packed, i, map.nearest(s[i] > 0.0f ? x[i] / s[i] : 0.0f));
  if (n & 1) packed[n >> 1] &= 0x0f;
}

void adamw4bit_update_ref(float* p, const float* g, int64_t n, int64_t rows, uint8_t* m_codes,
                          float* m_absmax, uint8_t* v_codes, float* v_scale, const AdamWHyper& h,
                          int64_t t, float grad_scale) {
  const auto c = adam_block_coeffs(h, t, grad_scale, "adamw4bit_ref");
  const Quant4Map &smap = signed_de4_map(), &umap = unsigned_linear4_map();
  const int64_t cols = rows > 0 ? n / rows : 0;
  auto scale_of = [&](const float* sc, int64_t k) {
    return rows > 0 ? std::min(sc[k / cols], sc[rows + k % cols]) : sc[k / kQuant4Block];
  };
  std::vector<float> m(n), v(n), s(n);
  for (int64_t k = 0; k < n; ++k) {
    m[k] = smap.values[code4_at(m_codes, k)] * m_absmax[k / kQuant4Block];
    v[k] = umap.values[code4_at(v_codes, k)] * scale_of(v_scale, k);
  }
  for (int64_t k = 0; k < n; ++k) {
    const float gi = g[k] * c.grad_scale;
    m[k] = std::fma(c.beta1, m[k], c.one_minus_beta1 * gi);
    v[k] = std::fma(c.beta2, v[k], c.one_minus_beta2 * (gi * gi));
    const float denom = std::fma(std::sqrt(v[k]), c.inv_sqrt_bc2, c.eps);
    p[k] = std::fma(-c.step_size, m[k] / denom, p[k] * c.decay);
  }
  for (int64_t b = 0; b * kQuant4Block < n; ++b) {
    const int64_t off = b * kQuant4Block, nb = std::min(kQuant4Block, n - off);
    m_absmax[b] = quantize_block4_ref(m.data() + off, nb, smap, m_codes + off / 2);
  }
  if (rows > 0) {
    std::vector<float> next(static_cast<size_t>(rows + cols), 0.0f);
    for (int64_t k = 0; k < n; ++k) {
      next[k / cols] = std::max(next[k / cols], v[k]);
      next[rows + k % cols] = std::max(next[rows + k % cols], v[k]);
    }
    std::copy(next.begin(), next.end(), v_scale);
    for (int64_t k = 0; k < n; ++k) s[k] = scale_of(v_scale, k);
    for (int64_t b = 0; b * kQuant4Block < n; ++b) {
      const int64_t off = b * kQuant4Block, nb = std::min(kQuant4Block, n - off);
      quantize_scaled4_ref(v.data() + off, s.data() + off, nb, umap, v_codes + off / 2);
    }
  } else {
    for (int64_t b = 0; b * kQuant4Block < n; ++b) {
      const int64_t off = b * kQuant4Block, nb = std::min(kQuant4Block, n - off);
      v_scale[b] = quantize_block4_ref(v.data() + off, nb, umap, v_codes + off / 2);
    }
  }
}

}  // namespace memfit::kernels::ref
