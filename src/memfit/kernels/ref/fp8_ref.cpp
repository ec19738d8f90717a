// Brute-force FP8 reference (fp8_ref.h): formula values and a nearest-code search.
#include "memfit/kernels/ref/fp8_ref.h"

#include <cmath>
#include <limits>

namespace memfit::kernels::ref {

double fp8_value_ref(Fp8Format f, uint8_t c) {
  const bool e4m3 = f == Fp8Format::e4m3;
  const int M = e4m3 ? 3 : 2, E = e4m3 ? 4 : 5, bias = e4m3 ? 7 : 15;
  const int s = c >> 7, e = (c >> M) & ((1 << E) - 1), m = c & ((1 << M) - 1);
  double v;
  if (e4m3 && e == 15 && m == 7)
    v = std::numeric_limits<double>::quiet_NaN();
  else if (!e4m3 && e == 31)
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  else if (e == 0)
    v = std::ldexp(static_cast<double>(m) / (1 << M), 1 - bias);
  else
    v = std::ldexp(1.0 + static_cast<double>(m) / (1 << M), e - bias);
  return s ? -v : v;
}

uint8_t fp8_encode_ref(Fp8Format f, double y) {
  const uint8_t sign = std::signbit(y) ? 0x80 : 0x00;
  if (std::isnan(y)) return sign | 0x7f;
  const double a = std::fmin(std::fabs(y), static_cast<double>(fp8_max(f)));  // saturate
  int best = -1;
  double best_err = 0.0;
  for (int c = 0; c < 128; ++c) {  // the non-negative codes, in increasing value
    const double v = fp8_value_ref(f, static_cast<uint8_t>(c));
    if (!std::isfinite(v)) continue;
    const double err = std::fabs(v - a);
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(sign | best);  // beyond the largest finite: it is the nearest
}

void fp8_quantize_ref(const float* x, int64_t n, float scale, Fp8Format f, uint8_t* codes) {
  for (int64_t i = 0; i < n; ++i) codes[i] = fp8_encode_ref(f, static_cast<double>(x[i] * scale));
}

}  // namespace memfit::kernels::ref
