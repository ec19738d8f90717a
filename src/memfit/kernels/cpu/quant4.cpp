// 4-bit quantisation: the two maps, the nearest-code search (one source for every SIMD target,
// simd.h: fifteen comparisons a value, counted), the packing and the decoding. See Note [4-bit
// optimizer].
#include "memfit/kernels/cpu/quant4.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/quant4.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {
namespace {

// The codes of the Lanes(d) values xs: how many of the 15 thresholds each exceeds.
HWY_INLINE hn::Vec<hn::RebindToSigned<DF>> codes4(DF d, VF xs, const float* th) {
  const hn::RebindToSigned<DF> di;
  auto c = hn::Zero(di);
  for (int k = 0; k + 1 < kQuant4Codes; ++k)
    c = hn::Sub(c, hn::VecFromMask(di, hn::RebindMask(di, hn::Gt(xs, hn::Set(d, th[k])))));
  return c;
}

// Codes of the n scaled values f(i) (a vector of lanes from i), packed two a byte.
template <class F>
HWY_INLINE void encode(DF d, int64_t n, const float* th, uint8_t* packed, F&& scaled) {
  const hn::Rebind<uint8_t, DF> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  HWY_ALIGN uint8_t codes[kQuant4Block + kMaxLanes];
  for (int64_t i = 0; i < n; i += N)
    hn::StoreU(hn::DemoteTo(d8, codes4(d, scaled(i), th)), d8, codes + i);
  for (int64_t i = 0; i + 1 < n; i += 2)
    packed[i >> 1] = static_cast<uint8_t>(codes[i] | (codes[i + 1] << 4));
  if (n & 1) packed[n >> 1] = codes[n - 1];
}

// Lanes [i, i + N) of x, zero past n.
HWY_INLINE VF load_tail(DF d, const float* x, int64_t i, int64_t n) {
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  return i + N <= n ? hn::LoadU(d, x + i) : load_n<DType::f32>(d, x + i, n - i);
}

}  // namespace

float QuantizeBlock4(const float* x, int64_t n, const Quant4Map& map, uint8_t* packed) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF vmax = hn::Zero(d);
  for (int64_t i = 0; i < n; i += N) vmax = hn::Max(vmax, hn::Abs(load_tail(d, x, i, n)));
  const float absmax = max_lanes(d, vmax);
  const VF inv = hn::Set(d, absmax > 0.0f ? 1.0f / absmax : 0.0f);
  encode(d, n, map.thresholds.data(), packed,
         [&](int64_t i) { return hn::Mul(load_tail(d, x, i, n), inv); });
  return absmax;
}

void QuantizeScaled4(const float* x, const float* s, int64_t n, const Quant4Map& map,
                     uint8_t* packed) {
  const DF d;
  const VF zero = hn::Zero(d);
  encode(d, n, map.thresholds.data(), packed, [&](int64_t i) {
    const VF si = load_tail(d, s, i, n);
    const VF safe = hn::IfThenElse(hn::Gt(si, zero), si, hn::Set(d, 1.0f));
    return hn::IfThenElseZero(hn::Gt(si, zero), hn::Div(load_tail(d, x, i, n), safe));
  });
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <limits>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(QuantizeBlock4);
HWY_EXPORT(QuantizeScaled4);

namespace {

Quant4Map make_map(const std::array<float, kQuant4Codes>& values) {
  Quant4Map map;
  map.values = values;
  for (int i = 0; i + 1 < kQuant4Codes; ++i)
    map.thresholds[i] =
        static_cast<float>((static_cast<double>(values[i]) + values[i + 1]) / 2.0);
  map.thresholds[kQuant4Codes - 1] = std::numeric_limits<float>::infinity();
  return map;
}

void check_block(int64_t n, const char* op) {
  MEMFIT_CHECK(n >= 1 && n <= kQuant4Block, op, "a block holds 1 to {} values, got {}",
               kQuant4Block, n);
}

}  // namespace

const Quant4Map& signed_de4_map() {
  // create_dynamic_map(True, 3, 4) as its float32 arithmetic gives it (torch.linspace, the
  // means, the decade scale): +-0.2125 and +-0.0325 are one float ulp from what a construction
  // in double rounds to (as make_dynamic_map builds the 8-bit maps); the reference's are kept.
  static const Quant4Map map = make_map({-0.887499988079071f, -0.6625000238418579f, -0.4375f,
                                         -0.21249999105930328f, -0.07750000059604645f,
                                         -0.0325000025331974f, -0.005499999970197678f, 0.0f,
                                         0.005499999970197678f, 0.0325000025331974f,
                                         0.07750000059604645f, 0.21249999105930328f, 0.4375f,
                                         0.6625000238418579f, 0.887499988079071f, 1.0f});
  return map;
}

const Quant4Map& unsigned_linear4_map() {
  static const Quant4Map map = [] {
    std::array<float, kQuant4Codes> v{};
    for (int k = 0; k < kQuant4Codes; ++k) v[k] = static_cast<float>(k + 1) / 16.0f;
    return make_map(v);
  }();
  return map;
}

float quantize_block4(const float* x, int64_t n, const Quant4Map& map, uint8_t* packed) {
  check_block(n, "quantize_block4");
  return MEMFIT_SIMD_DISPATCH(QuantizeBlock4)(x, n, map, packed);
}

void quantize_scaled4(const float* x, const float* s, int64_t n, const Quant4Map& map,
                      uint8_t* packed) {
  check_block(n, "quantize_scaled4");
  MEMFIT_SIMD_DISPATCH(QuantizeScaled4)(x, s, n, map, packed);
}

void dequantize_block4(const uint8_t* packed, int64_t n, float absmax, const Quant4Map& map,
                       float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = map.values[code4_at(packed, i)] * absmax;
}

void dequantize_scaled4(const uint8_t* packed, const float* s, int64_t n, const Quant4Map& map,
                        float* x) {
  for (int64_t i = 0; i < n; ++i) x[i] = map.values[code4_at(packed, i)] * s[i];
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
