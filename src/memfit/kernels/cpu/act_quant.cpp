// Activation compression: block-wise int8 and FP8 E4M3 quantisation of saved activations and
// its inverse (act_quant.h), one source for every SIMD target (simd.h), threaded over blocks.
// Each block is read twice (its absmax, then its codes) while it sits in L1; the arithmetic is
// kernels/ref/act_quant_ref.cpp's, lane by lane, so every target writes the same bits.
#include "memfit/kernels/cpu/act_quant.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/act_quant.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <limits>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {
namespace {

// The E4M3 codes (in the low byte of each lane) of y, |y| <= 448: fp8_e4m3_from_f32 lane by
// lane.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<D>> fp8_codes(D d, hn::Vec<D> y) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const auto a = hn::Abs(y);
  const auto v = hn::BitCast(du, a);
  const auto lsb = hn::And(hn::ShiftRight<20>(v), hn::Set(du, 1u));
  const auto normal = hn::Sub(hn::ShiftRight<20>(hn::Add(v, hn::Add(lsb, hn::Set(du, 0x7ffffu)))),
                              hn::Set(du, 120u << 3));
  const auto sub = hn::BitCast(du, hn::ConvertTo(di, hn::Round(hn::Mul(a, hn::Set(d, 512.0f)))));
  const auto code = hn::IfThenElse(hn::RebindMask(du, hn::Lt(a, hn::Set(d, 0x1p-6f))), sub, normal);
  const auto sign = hn::And(hn::ShiftRight<24>(hn::BitCast(du, y)), hn::Set(du, 0x80u));
  return hn::Or(code, sign);
}

// The values of E4M3 codes c (0..255 in each lane): f32_from_fp8_e4m3 lane by lane.
template <class D>
HWY_INLINE hn::Vec<D> fp8_values(D d, hn::Vec<hn::RebindToUnsigned<D>> c) {
  const hn::RebindToUnsigned<D> du;
  const hn::RebindToSigned<D> di;
  const auto e = hn::And(hn::ShiftRight<3>(c), hn::Set(du, 0xfu));
  const auto m = hn::And(c, hn::Set(du, 7u));
  const auto normal = hn::BitCast(
      d, hn::Or(hn::ShiftLeft<23>(hn::Add(e, hn::Set(du, 120u))), hn::ShiftLeft<20>(m)));
  const auto sub = hn::Mul(hn::ConvertTo(d, hn::BitCast(di, m)), hn::Set(d, 0x1p-9f));
  const auto a = hn::IfThenElse(hn::RebindMask(d, hn::Eq(e, hn::Zero(du))), sub, normal);
  return hn::Or(a, hn::BitCast(d, hn::ShiftLeft<24>(hn::And(c, hn::Set(du, 0x80u)))));
}

// Lanes(d) values of block data at x + i, the first `count` of them real (count < Lanes: a
// tail, zero-padded).
template <DType S, class D>
HWY_INLINE hn::Vec<D> load_part(D d, const half::Storage<S>* x, int64_t count) {
  return count >= static_cast<int64_t>(hn::Lanes(d)) ? load<S>(d, x) : load_n<S>(d, x, count);
}

template <DType S, bool kFp8>
void quantize_blocks(const half::Storage<S>* x, int64_t n, uint8_t* codes, float* scales,
                     int64_t b0, int64_t b1) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<int8_t, DF> d8;
  const hn::Rebind<uint8_t, DF> du8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  constexpr float qmax = kFp8 ? kFp8Max : kInt8Max;
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t begin = b * kActBlock, m = std::min(kActBlock, n - begin);
    const half::Storage<S>* xb = x + begin;
    VF vmax = hn::Zero(d);
    auto finite = hn::Eq(vmax, vmax);  // all true
    for (int64_t i = 0; i < m; i += N) {
      const VF v = load_part<S>(d, xb + i, m - i);
      finite = hn::And(finite, hn::IsFinite(v));
      vmax = hn::Max(vmax, hn::Abs(v));
    }
    uint8_t* cb = codes + begin;
    if (!hn::AllTrue(d, finite)) {
      scales[b] = std::numeric_limits<float>::quiet_NaN();
      std::fill(cb, cb + m, uint8_t{0});
      continue;
    }
    float absmax = max_lanes(d, vmax);
    if (absmax > 0.0f) absmax = std::max(absmax, kActMinAbsmax);
    scales[b] = absmax / qmax;
    const VF inv = hn::Set(d, absmax > 0.0f ? qmax / absmax : 0.0f);
    const VF hi = hn::Set(d, qmax), lo = hn::Set(d, -qmax);
    for (int64_t i = 0; i < m; i += N) {
      const VF y = hn::Min(hn::Max(hn::Mul(load_part<S>(d, xb + i, m - i), inv), lo), hi);
      HWY_ALIGN uint8_t buf[kMaxLanes];
      uint8_t* dst = m - i >= N ? cb + i : buf;
      if constexpr (kFp8)
        hn::StoreU(hn::DemoteTo(du8, hn::BitCast(di, fp8_codes(d, y))), du8, dst);
      else
        hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, hn::Round(y))), d8,
                   reinterpret_cast<int8_t*>(dst));
      if (dst == buf) std::copy_n(buf, m - i, cb + i);
    }
  }
}

template <DType D, bool kFp8>
void dequantize_blocks(const uint8_t* codes, const float* scales, int64_t n,
                       half::Storage<D>* x, int64_t b0, int64_t b1) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<int8_t, DF> d8;
  const hn::Rebind<uint8_t, DF> du8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  for (int64_t b = b0; b < b1; ++b) {
    const int64_t begin = b * kActBlock, m = std::min(kActBlock, n - begin);
    const VF scale = hn::Set(d, scales[b]);
    for (int64_t i = 0; i < m; i += N) {
      HWY_ALIGN uint8_t buf[kMaxLanes] = {};
      const bool whole = m - i >= N;
      const uint8_t* src = codes + begin + i;
      if (!whole) src = static_cast<const uint8_t*>(std::memcpy(buf, src, m - i));
      VF v;
      if constexpr (kFp8)
        v = fp8_values(d, hn::PromoteTo(du, hn::LoadU(du8, src)));
      else
        v = hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const int8_t*>(src))));
      v = hn::Mul(v, scale);
      if (whole)
        store<D>(d, v, x + begin + i);
      else
        store_n<D>(d, v, x + begin + i, m - i);
    }
  }
}

}  // namespace

void QuantizeBlocks(DType st, bool fp8, const void* x, int64_t n, uint8_t* codes, float* scales,
                    int64_t b0, int64_t b1) {
  half::dispatch(st, [&](auto s) {
    constexpr DType S = decltype(s)::value;
    const auto* xs = static_cast<const half::Storage<S>*>(x);
    if (fp8)
      quantize_blocks<S, true>(xs, n, codes, scales, b0, b1);
    else
      quantize_blocks<S, false>(xs, n, codes, scales, b0, b1);
  });
}

void DequantizeBlocks(DType dt, bool fp8, const uint8_t* codes, const float* scales, int64_t n,
                      void* x, int64_t b0, int64_t b1) {
  half::dispatch(dt, [&](auto t) {
    constexpr DType D = decltype(t)::value;
    auto* xd = static_cast<half::Storage<D>*>(x);
    if (fp8)
      dequantize_blocks<D, true>(codes, scales, n, xd, b0, b1);
    else
      dequantize_blocks<D, false>(codes, scales, n, xd, b0, b1);
  });
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <omp.h>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(QuantizeBlocks);
HWY_EXPORT(DequantizeBlocks);

namespace {

// fn(b0, b1) over one contiguous range of blocks per thread; one thread for small tensors.
template <typename Fn>
void parallel_blocks(int64_t n, Fn&& fn) {
  const int64_t blocks = act_blocks(n);
  if (blocks == 0) return;
#pragma omp parallel if (n > kParallelGrain)
  {
    const int64_t nth = omp_get_num_threads(), tid = omp_get_thread_num();
    const int64_t b0 = blocks * tid / nth, b1 = blocks * (tid + 1) / nth;
    if (b0 < b1) fn(b0, b1);
  }
}

// Whether the codes are FP8 (u8) or int8 (i8), after checking the three tensors agree.
bool check_args(const Tensor& x, const Tensor& codes, const Tensor& scales, std::string_view op) {
  expect_float_any_shape(x, op, "x");
  MEMFIT_CHECK(codes.defined(), op, "codes is undefined");
  MEMFIT_CHECK_DTYPE(codes.dtype() == DType::i8 || codes.dtype() == DType::u8, op,
                     "codes must be i8 (int8) or u8 (FP8 E4M3), got {} {}",
                     dtype_name(codes.dtype()), codes.shape());
  expect_any_shape(codes, op, "codes", codes.dtype());
  expect_any_shape(scales, op, "scales", DType::f32);
  MEMFIT_CHECK_SHAPE(codes.numel() == x.numel() && scales.numel() == act_blocks(x.numel()), op,
                     "x {} needs codes of {} values and scales of {}, got codes {} and scales {}",
                     x.shape(), x.numel(), act_blocks(x.numel()), codes.shape(), scales.shape());
  return codes.dtype() == DType::u8;
}

uint8_t* code_bytes(const Tensor& codes) { return static_cast<uint8_t*>(codes.raw_data()); }

}  // namespace

void act_quantize(const Tensor& x, Tensor& codes, Tensor& scales) {
  KernelScope timed("act_quantize");
  const bool fp8 = check_args(x, codes, scales, "act_quantize");
  const DType st = x.dtype();
  const void* xp = x.raw_data();
  uint8_t* cp = code_bytes(codes);
  float* sp = scales.data<float>();
  const int64_t n = x.numel();
  parallel_blocks(n, [&](int64_t b0, int64_t b1) {
    MEMFIT_SIMD_DISPATCH(QuantizeBlocks)(st, fp8, xp, n, cp, sp, b0, b1);
  });
}

void act_dequantize(const Tensor& codes, const Tensor& scales, Tensor& x) {
  KernelScope timed("act_dequantize");
  const bool fp8 = check_args(x, codes, scales, "act_dequantize");
  const DType dt = x.dtype();
  void* xp = x.raw_data();
  const uint8_t* cp = code_bytes(codes);
  const float* sp = scales.data<float>();
  const int64_t n = x.numel();
  parallel_blocks(n, [&](int64_t b0, int64_t b1) {
    MEMFIT_SIMD_DISPATCH(DequantizeBlocks)(dt, fp8, cp, sp, n, xp, b0, b1);
  });
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
