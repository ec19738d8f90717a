// FP8 casts (fp8.h): amax, quantize and dequantize, one source for every SIMD target (simd.h),
// threaded over contiguous ranges. The encoder is fp8_encode's integer arithmetic lane by lane
// (and the decoder a 256-entry table gathered by code), so every target writes the same bits.
#include "memfit/kernels/cpu/fp8.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/fp8.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <array>
#include <limits>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {
namespace {

// fp8_encode(F, y) lane by lane, the code in the low byte of each lane.
template <Fp8Format F, class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> encode(D d, hn::Vec<D> y) {
  constexpr int kM = fp8_detail::mbits(F), kShift = 23 - kM;
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const auto nan = hn::IsNaN(y);
  // NaN lanes computed as 0, their code replaced below.
  const auto a = hn::IfThenZeroElse(nan, hn::Min(hn::Abs(y), hn::Set(d, fp8_max(F))));
  const auto v = hn::BitCast(du, a);
  const auto lsb = hn::And(hn::ShiftRight<kShift>(v), hn::Set(du, 1u));
  const auto normal =
      hn::Sub(hn::ShiftRight<kShift>(hn::Add(v, hn::Add(lsb, hn::Set(du, (1u << (kShift - 1)) - 1u)))),
              hn::Set(du, static_cast<uint32_t>(127 - fp8_detail::bias(F)) << kM));
  const auto sub = hn::BitCast(
      du, hn::ConvertTo(di, hn::Round(hn::Mul(a, hn::Set(d, fp8_detail::sub_inv_step(F))))));
  auto code = hn::IfThenElse(hn::RebindMask(du, hn::Lt(a, hn::Set(d, fp8_detail::min_normal(F)))),
                             sub, normal);
  code = hn::IfThenElse(hn::RebindMask(du, nan), hn::Set(du, 0x7fu), code);
  const auto sign = hn::And(hn::ShiftRight<24>(hn::BitCast(du, y)), hn::Set(du, 0x80u));
  return hn::Or(code, sign);
}

// kViaBf16: each value rounded to bf16 (nearest even) before it is scaled and encoded.
template <DType S, Fp8Format F, bool kViaBf16 = false>
void quantize_range(const half::Storage<S>* x, float scale, uint8_t* codes, int64_t begin,
                    int64_t end) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint8_t, DF> du8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF s = hn::Set(d, scale);
  for (int64_t i = begin; i < end; i += N) {
    const int64_t m = std::min(N, end - i);
    VF v = m == N ? load<S>(d, x + i) : load_n<S>(d, x + i, m);
    if constexpr (kViaBf16) v = hn::BitCast(d, hn::ShiftLeft<16>(bf16_bits(d, v)));
    const auto c = hn::DemoteTo(du8, hn::BitCast(di, encode<F>(d, hn::Mul(v, s))));
    if (m == N) {
      hn::StoreU(c, du8, codes + i);
    } else {
      HWY_ALIGN uint8_t buf[kMaxLanes];
      hn::StoreU(c, du8, buf);
      std::copy_n(buf, m, codes + i);
    }
  }
}

template <Fp8Format F>
const float* decode_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[static_cast<size_t>(c)] = fp8_decode(F, static_cast<uint8_t>(c));
    return t;
  }();
  return table.data();
}

// x -> code -> value * inv_scale, lane by lane, stored as D.
template <DType S, DType D, Fp8Format F>
void round_trip_range(const half::Storage<S>* x, float scale, half::Storage<D>* out,
                      int64_t begin, int64_t end) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF s = hn::Set(d, scale), inv = hn::Set(d, 1.0f / scale);
  const float* table = decode_table<F>();
  for (int64_t i = begin; i < end; i += N) {
    const int64_t m = std::min(N, end - i);
    const VF v = m == N ? load<S>(d, x + i) : load_n<S>(d, x + i, m);
    const auto code = hn::BitCast(di, encode<F>(d, hn::Mul(v, s)));
    const VF y = hn::Mul(hn::GatherIndex(d, table, code), inv);
    if (m == N)
      store<D>(d, y, out + i);
    else
      store_n<D>(d, y, out + i, m);
  }
}

template <DType D, Fp8Format F>
void dequantize_range(const uint8_t* codes, float inv_scale, half::Storage<D>* x, int64_t begin,
                      int64_t end) {
  const float* table = decode_table<F>();
  const DF d;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint8_t, DF> du8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF s = hn::Set(d, inv_scale);
  for (int64_t i = begin; i < end; i += N) {
    const int64_t m = std::min(N, end - i);
    HWY_ALIGN uint8_t buf[kMaxLanes] = {};
    const uint8_t* src = codes + i;
    if (m < N) src = static_cast<const uint8_t*>(std::memcpy(buf, src, static_cast<size_t>(m)));
    const auto idx = hn::BitCast(di, hn::PromoteTo(hn::RebindToUnsigned<DF>(), hn::LoadU(du8, src)));
    const VF v = hn::Mul(hn::GatherIndex(d, table, idx), s);
    if (m == N)
      store<D>(d, v, x + i);
    else
      store_n<D>(d, v, x + i, m);
  }
}

}  // namespace

// {max |x|, whether a NaN was seen} over [begin, end).
void AmaxRange(DType st, const void* x, int64_t begin, int64_t end, float* amax, bool* nan) {
  half::dispatch(st, [&](auto s) {
    constexpr DType S = decltype(s)::value;
    const auto* xs = static_cast<const half::Storage<S>*>(x);
    const DF d;
    const int64_t N = static_cast<int64_t>(hn::Lanes(d));
    VF vmax = hn::Zero(d);
    auto any_nan = hn::Lt(vmax, vmax);  // all false
    for (int64_t i = begin; i < end; i += N) {
      const int64_t m = std::min(N, end - i);
      const VF v = m == N ? load<S>(d, xs + i) : load_n<S>(d, xs + i, m);
      any_nan = hn::Or(any_nan, hn::IsNaN(v));
      vmax = hn::Max(vmax, hn::IfThenZeroElse(hn::IsNaN(v), hn::Abs(v)));
    }
    *amax = max_lanes(d, vmax);
    *nan = !hn::AllFalse(d, any_nan);
  });
}

void QuantizeRange(DType st, Fp8Format f, const void* x, float scale, uint8_t* codes,
                   int64_t begin, int64_t end) {
  half::dispatch(st, [&](auto s) {
    constexpr DType S = decltype(s)::value;
    const auto* xs = static_cast<const half::Storage<S>*>(x);
    if (f == Fp8Format::e4m3)
      quantize_range<S, Fp8Format::e4m3>(xs, scale, codes, begin, end);
    else
      quantize_range<S, Fp8Format::e5m2>(xs, scale, codes, begin, end);
  });
}

void QuantizeViaBf16Range(Fp8Format f, const float* x, float scale, uint8_t* codes,
                          int64_t begin, int64_t end) {
  if (f == Fp8Format::e4m3)
    quantize_range<DType::f32, Fp8Format::e4m3, true>(x, scale, codes, begin, end);
  else
    quantize_range<DType::f32, Fp8Format::e5m2, true>(x, scale, codes, begin, end);
}

void DequantizeRange(DType dt, Fp8Format f, const uint8_t* codes, float inv_scale, void* x,
                     int64_t begin, int64_t end) {
  half::dispatch(dt, [&](auto t) {
    constexpr DType D = decltype(t)::value;
    auto* xd = static_cast<half::Storage<D>*>(x);
    if (f == Fp8Format::e4m3)
      dequantize_range<D, Fp8Format::e4m3>(codes, inv_scale, xd, begin, end);
    else
      dequantize_range<D, Fp8Format::e5m2>(codes, inv_scale, xd, begin, end);
  });
}

void RoundTripRange(DType st, DType dt, Fp8Format f, const void* x, float scale, void* out,
                    int64_t begin, int64_t end) {
  half::dispatch(st, [&](auto s) {
    constexpr DType S = decltype(s)::value;
    half::dispatch(dt, [&](auto t) {
      constexpr DType D = decltype(t)::value;
      const auto* xs = static_cast<const half::Storage<S>*>(x);
      auto* od = static_cast<half::Storage<D>*>(out);
      if (f == Fp8Format::e4m3)
        round_trip_range<S, D, Fp8Format::e4m3>(xs, scale, od, begin, end);
      else
        round_trip_range<S, D, Fp8Format::e5m2>(xs, scale, od, begin, end);
    });
  });
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include <vector>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(AmaxRange);
HWY_EXPORT(QuantizeRange);
HWY_EXPORT(QuantizeViaBf16Range);
HWY_EXPORT(DequantizeRange);
HWY_EXPORT(RoundTripRange);

namespace {

void check_source(const Tensor& x, std::string_view op, std::string_view name) {
  MEMFIT_CHECK(x.defined(), op, "{} is undefined", name);
  MEMFIT_CHECK_DTYPE(x.dtype() == DType::f32 || x.dtype() == DType::bf16, op,
                     "{} must be f32 or bf16, got {} {}", name, dtype_name(x.dtype()), x.shape());
  expect_any_shape(x, op, name, x.dtype());
}

void check_codes(const Tensor& codes, int64_t n, std::string_view op) {
  MEMFIT_CHECK(codes.defined(), op, "codes is undefined");
  expect_any_shape(codes, op, "codes", DType::u8);
  MEMFIT_CHECK_SHAPE(codes.numel() == n, op, "codes {} must hold {} values", codes.shape(), n);
}

}  // namespace

const char* fp8_format_name(Fp8Format f) { return f == Fp8Format::e4m3 ? "e4m3" : "e5m2"; }

float fp8_scale(float amax, Fp8Format f) {
  if (!std::isfinite(amax)) return std::numeric_limits<float>::quiet_NaN();
  return fp8_max(f) / std::max(amax, kFp8MinAmax);
}

float fp8_scale_pow2(float amax, Fp8Format f) {
  const float s = fp8_scale(amax, f);
  if (std::isnan(s)) return s;
  int e = 0;
  std::frexp(s, &e);  // s = m 2^e, m in [0.5, 1)
  return std::ldexp(1.0f, e - 1);
}

float fp8_amax(const Tensor& x) {
  KernelScope timed("fp8_amax");
  check_source(x, "fp8_amax", "x");
  const int64_t n = x.numel();
  const DType st = x.dtype();
  const void* xp = x.raw_data();
  std::vector<float> part(static_cast<size_t>(omp_get_max_threads()), 0.0f);
  std::vector<char> nan(part.size(), 0);
  parallel_ranges(n, [&](int64_t b, int64_t e) {
    const auto t = static_cast<size_t>(omp_get_thread_num());
    bool seen = false;
    MEMFIT_SIMD_DISPATCH(AmaxRange)(st, xp, b, e, &part[t], &seen);
    nan[t] = seen;
  });
  if (std::find(nan.begin(), nan.end(), 1) != nan.end())
    return std::numeric_limits<float>::quiet_NaN();
  return *std::max_element(part.begin(), part.end());
}

void fp8_quantize(const Tensor& x, float scale, Fp8Format f, Tensor& codes) {
  KernelScope timed("fp8_quantize");
  check_source(x, "fp8_quantize", "x");
  check_codes(codes, x.numel(), "fp8_quantize");
  const DType st = x.dtype();
  const void* xp = x.raw_data();
  auto* cp = static_cast<uint8_t*>(codes.raw_data());
  parallel_ranges(x.numel(), [&](int64_t b, int64_t e) {
    MEMFIT_SIMD_DISPATCH(QuantizeRange)(st, f, xp, scale, cp, b, e);
  });
}

void fp8_quantize_via_bf16(const Tensor& x, float scale, Fp8Format f, Tensor& codes) {
  KernelScope timed("fp8_quantize");
  check_source(x, "fp8_quantize_via_bf16", "x");
  MEMFIT_CHECK_DTYPE(x.dtype() == DType::f32, "fp8_quantize_via_bf16", "x must be f32, got {}",
                     dtype_name(x.dtype()));
  check_codes(codes, x.numel(), "fp8_quantize_via_bf16");
  const float* xp = x.data<float>();
  auto* cp = static_cast<uint8_t*>(codes.raw_data());
  parallel_ranges(x.numel(), [&](int64_t b, int64_t e) {
    MEMFIT_SIMD_DISPATCH(QuantizeViaBf16Range)(f, xp, scale, cp, b, e);
  });
}

float fp8_amax_via_bf16(const Tensor& x) {
  const float a = fp8_amax(x);
  return std::isnan(a) ? a : f32_from_bf16(bf16_from_f32(a));
}

void fp8_dequantize(const Tensor& codes, Fp8Format f, float inv_scale, Tensor& x) {
  KernelScope timed("fp8_dequantize");
  check_source(x, "fp8_dequantize", "x");
  check_codes(codes, x.numel(), "fp8_dequantize");
  const DType dt = x.dtype();
  void* xp = x.raw_data();
  const auto* cp = static_cast<const uint8_t*>(codes.raw_data());
  parallel_ranges(x.numel(), [&](int64_t b, int64_t e) {
    MEMFIT_SIMD_DISPATCH(DequantizeRange)(dt, f, cp, inv_scale, xp, b, e);
  });
}

void fp8_round_trip(const Tensor& x, float scale, Fp8Format f, Tensor& out) {
  KernelScope timed("fp8_round_trip");
  check_source(x, "fp8_round_trip", "x");
  check_source(out, "fp8_round_trip", "out");
  MEMFIT_CHECK_SHAPE(out.numel() == x.numel(), "fp8_round_trip", "out {} must hold x's {} values",
                     out.shape(), x.numel());
  const DType st = x.dtype(), dt = out.dtype();
  MEMFIT_CHECK(x.raw_data() != out.raw_data() || st == dt, "fp8_round_trip",
               "in place needs one dtype, got {} into {}", dtype_name(st), dtype_name(dt));
  const void* xp = x.raw_data();
  void* op = out.raw_data();
  parallel_ranges(x.numel(), [&](int64_t b, int64_t e) {
    MEMFIT_SIMD_DISPATCH(RoundTripRange)(st, dt, f, xp, scale, op, b, e);
  });
}

float fp8_cast_dynamic(const Tensor& x, Fp8Format f, Tensor& out) {
  const float scale = fp8_scale_pow2(fp8_amax(x), f);
  fp8_round_trip(x, scale, f, out);
  return scale;
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
