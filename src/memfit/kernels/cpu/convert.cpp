// Conversions and non-finite checks over whole tensors: split over threads with
// parallel_ranges, 16 lanes at a time through half_vec.h, the scalar definitions of
// core/dtype.h and convert.h are what every SIMD target reproduces bit for bit. All of them stream
// memory once, so they run at memory bandwidth.
// One source for every SIMD target (simd.h); the public functions are at the end.
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/convert.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

// dst[i] = src[i] for i < n, widening or rounding as the types say. One thread.
template <DType S, DType D>
void convert_range(half::Storage<D>* dst, const half::Storage<S>* src, int64_t n) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  for (; i + N <= n; i += N) store<D>(d, load<S>(d, src + i), dst + i);
  if (i < n) store_n<D>(d, load_n<S>(d, src + i, n - i), dst + i, n - i);
}

void ConvertN(DType st, DType dt, void* dst, const void* src, int64_t n) {
  half::dispatch(st, [&](auto s) {
    half::dispatch(dt, [&](auto t) {
      constexpr DType S = decltype(s)::value, D = decltype(t)::value;
      convert_range<S, D>(static_cast<half::Storage<D>*>(dst),
                          static_cast<const half::Storage<S>*>(src), n);
    });
  });
}

// Elements [begin, end) of a stochastic conversion; global index of element i is index0 + i.
// The random bits of a vector of consecutive indices under one key are sr_bits lane by lane.
void StochasticRange(uint16_t* dst, const float* src, int64_t begin, int64_t end, uint64_t seed,
                     uint64_t index0) {
  const DF d;
  const hn::RebindToUnsigned<DF> du;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto iota = hn::Iota(du, 0);  // Highway 1.0.3 builds Iota in memory: once, not per vector
  int64_t i = begin;
  for (; i + N <= end; i += N) {
    const uint64_t first = index0 + static_cast<uint64_t>(i), last = first + N - 1;
    if ((first >> 32) != (last >> 32)) break;  // lanes across a 2^32 boundary: scalar
    const auto key = hn::Set(du, sr_key(seed, static_cast<uint32_t>(first >> 32)));
    auto x = hn::Xor(hn::Add(iota, hn::Set(du, static_cast<uint32_t>(first))), key);
    x = hn::Xor(x, hn::ShiftRight<16>(x));
    x = hn::Mul(x, hn::Set(du, 0x7feb352du));
    x = hn::Xor(x, hn::ShiftRight<15>(x));
    x = hn::Mul(x, hn::Set(du, 0x846ca68bu));
    x = hn::Xor(x, hn::ShiftRight<16>(x));
    store_u16(d, bf16_stochastic_bits(d, hn::LoadU(d, src + i), x), dst + i);
  }
  for (; i < end; ++i) {
    const uint64_t idx = index0 + static_cast<uint64_t>(i);
    const uint32_t key = sr_key(seed, static_cast<uint32_t>(idx >> 32));
    dst[i] = bf16_from_f32_stochastic(src[i], sr_bits(key, static_cast<uint32_t>(idx)));
  }
}

// True if x[begin, end) has no inf or NaN: the exponent field is all ones exactly for those.
template <typename T>
bool finite_bits(const T* x, int64_t begin, int64_t end, T e) {
  const hn::ScalableTag<T> d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const auto ev = hn::Set(d, e);
  auto bad = hn::Zero(d);
  int64_t i = begin;
  for (; i + N <= end; i += N)
    bad = hn::Or(bad, hn::VecFromMask(d, hn::Eq(hn::And(hn::LoadU(d, x + i), ev), ev)));
  if (!hn::AllTrue(d, hn::Eq(bad, hn::Zero(d)))) return false;
  for (; i < end; ++i)
    if ((x[i] & e) == e) return false;
  return true;
}

bool FiniteRange(DType t, const void* x, int64_t begin, int64_t end) {
  if (t == DType::f32)
    return finite_bits<uint32_t>(static_cast<const uint32_t*>(x), begin, end, 0x7f800000u);
  const uint16_t e = t == DType::bf16 ? 0x7f80 : 0x7c00;
  return finite_bits<uint16_t>(static_cast<const uint16_t*>(x), begin, end, e);
}

// As sum_squares: squares of floats are exact in double, two accumulators.
double UnscaleRange(float* g, float inv_scale, int64_t begin, int64_t end) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(dd));
  const auto s = hn::Set(dh, inv_scale);
  auto acc0 = hn::Zero(dd), acc1 = hn::Zero(dd);
  int64_t i = begin;
  for (; i + 2 * N <= end; i += 2 * N) {
    const auto x0 = hn::Mul(hn::LoadU(dh, g + i), s);
    const auto x1 = hn::Mul(hn::LoadU(dh, g + i + N), s);
    hn::StoreU(x0, dh, g + i);
    hn::StoreU(x1, dh, g + i + N);
    const auto lo = hn::PromoteTo(dd, x0), hi = hn::PromoteTo(dd, x1);
    acc0 = hn::MulAdd(lo, lo, acc0);
    acc1 = hn::MulAdd(hi, hi, acc1);
  }
  double total = hn::GetLane(hn::SumOfLanes(dd, hn::Add(acc0, acc1)));
  for (; i < end; ++i) {
    g[i] *= inv_scale;
    total += static_cast<double>(g[i]) * g[i];
  }
  return total;
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cmath>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(ConvertN);
HWY_EXPORT(StochasticRange);
HWY_EXPORT(FiniteRange);
HWY_EXPORT(UnscaleRange);

void convert_n(DType src_type, DType dst_type, void* dst, const void* src, int64_t n) {
  MEMFIT_SIMD_DISPATCH(ConvertN)(src_type, dst_type, dst, src, n);
}

void convert_n_team(DType src_type, DType dst_type, void* dst, const void* src, int64_t n) {
  const size_t ss = dtype_size(src_type), ds = dtype_size(dst_type);
  auto* y = static_cast<char*>(dst);
  const auto* x = static_cast<const char*>(src);
  parallel_ranges(n, [&](int64_t begin, int64_t end) {
    MEMFIT_SIMD_DISPATCH(ConvertN)(src_type, dst_type, y + begin * ds, x + begin * ss,
                                   end - begin);
  });
}

namespace {

void expect_float(const Tensor& t, std::string_view op, std::string_view name) {
  MEMFIT_CHECK(t.defined(), op, "{} is undefined", name);
  MEMFIT_CHECK_DTYPE(half::is_float_type(t.dtype()), op, "{} must be f32, bf16 or f16, got {} {}",
                     name, dtype_name(t.dtype()), t.shape());
  MEMFIT_CHECK_SHAPE(t.is_contiguous(), op, "{} {} must be contiguous", name, t.shape());
}

}  // namespace

void convert(Tensor& dst, const Tensor& src) {
  KernelScope timed("convert");
  constexpr std::string_view op = "convert";
  expect_float(src, op, "src");
  expect_float(dst, op, "dst");
  MEMFIT_CHECK_SHAPE(dst.numel() == src.numel(), op, "dst {} and src {} differ in element count",
                     dst.shape(), src.shape());
  if (dst.dtype() == src.dtype()) {  // a copy, bits and all (a round trip would quieten NaNs)
    const size_t size = dtype_size(src.dtype());
    const auto* x = static_cast<const char*>(src.raw_data());
    auto* y = static_cast<char*>(dst.raw_data());
    parallel_ranges(src.numel(), [&](int64_t begin, int64_t end) {
      std::memcpy(y + begin * size, x + begin * size, static_cast<size_t>(end - begin) * size);
    });
    return;
  }
  const DType st = src.dtype(), dt = dst.dtype();
  const auto* x = static_cast<const char*>(src.raw_data());
  auto* y = static_cast<char*>(dst.raw_data());
  const size_t ss = dtype_size(st), ds = dtype_size(dt);
  parallel_ranges(src.numel(), [&](int64_t begin, int64_t end) {
    MEMFIT_SIMD_DISPATCH(ConvertN)(st, dt, y + begin * ds, x + begin * ss, end - begin);
  });
}

void convert_stochastic(Tensor& dst, const Tensor& src, uint64_t seed, uint64_t index0) {
  KernelScope timed("convert_stochastic");
  constexpr std::string_view op = "convert_stochastic";
  expect_any_shape(src, op, "src", DType::f32);
  expect_any_shape(dst, op, "dst", DType::bf16);
  MEMFIT_CHECK_SHAPE(dst.numel() == src.numel(), op, "dst {} and src {} differ in element count",
                     dst.shape(), src.shape());
  const float* x = src.data<float>();
  auto* y = static_cast<uint16_t*>(dst.raw_data());
  parallel_ranges(src.numel(), [&](int64_t begin, int64_t end) {
    MEMFIT_SIMD_DISPATCH(StochasticRange)(y, x, begin, end, seed, index0);
  });
}

bool all_finite(const Tensor& t) {
  KernelScope timed("all_finite");
  expect_float(t, "all_finite", "t");
  const DType dt = t.dtype();
  const void* x = t.raw_data();
  // Each range's verdict as 0 / 1; the sum counts ranges with a non-finite element.
  return parallel_sum(t.numel(), [&](int64_t begin, int64_t end) {
           return MEMFIT_SIMD_DISPATCH(FiniteRange)(dt, x, begin, end) ? 0.0 : 1.0;
         }) == 0.0;
}

UnscaleResult unscale_and_check(Tensor& grads, float inv_scale) {
  expect_any_shape(grads, "unscale_and_check", "grads", DType::f32);
  float* g = grads.data<float>();
  const double sum = parallel_sum(grads.numel(), [&](int64_t begin, int64_t end) {
    return MEMFIT_SIMD_DISPATCH(UnscaleRange)(g, inv_scale, begin, end);
  });
  // A sum of squares of floats in double is finite exactly when every float is: the largest
  // square is below 2^256, so even 2^60 of them cannot overflow.
  return {std::isfinite(sum), sum};
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
