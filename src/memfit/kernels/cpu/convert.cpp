// Conversions and non-finite checks over whole tensors: split over threads with
// parallel_ranges, 16 lanes at a time through half_vec.h, the scalar definitions of
// core/dtype.h and convert.h for the tails and for builds without AVX-512. All of them stream
// memory once, so they run at memory bandwidth.
#include "memfit/kernels/cpu/convert.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/half_vec.h"
#include "memfit/kernels/cpu/parallel.h"

namespace memfit::kernels {
namespace {

using half::Storage;

void expect_float(const Tensor& t, std::string_view op, std::string_view name) {
  MEMFIT_CHECK(t.defined(), op, "{} is undefined", name);
  MEMFIT_CHECK_DTYPE(half::is_float_type(t.dtype()), op, "{} must be f32, bf16 or f16, got {} {}",
                     name, dtype_name(t.dtype()), t.shape());
  MEMFIT_CHECK_SHAPE(t.is_contiguous(), op, "{} {} must be contiguous", name, t.shape());
}

// Elements [begin, end) of a stochastic conversion; global index of element i is index0 + i.
void stochastic_range(uint16_t* dst, const float* src, int64_t begin, int64_t end, uint64_t seed,
                      uint64_t index0) {
  int64_t i = begin;
#if defined(__AVX512F__)
  for (; i < end; i += 16) {
    const int64_t n = end - i < 16 ? end - i : 16;
    const uint64_t first = index0 + static_cast<uint64_t>(i), last = first + n - 1;
    if ((first >> 32) != (last >> 32)) break;  // 16 lanes across a 2^32 boundary: scalar
    const __mmask16 m = vec::tail_mask(n);
    const __m512i key = _mm512_set1_epi32(static_cast<int>(sr_key(seed, first >> 32)));
    const __m512i bits = half::bf16_stochastic_bits(
        _mm512_maskz_loadu_ps(m, src + i), half::sr_bits16(key, static_cast<uint32_t>(first)));
    _mm512_mask_cvtepi32_storeu_epi16(dst + i, m, bits);
  }
#endif
  for (; i < end; ++i) {
    const uint64_t idx = index0 + static_cast<uint64_t>(i);
    const uint32_t key = sr_key(seed, static_cast<uint32_t>(idx >> 32));
    dst[i] = bf16_from_f32_stochastic(src[i], sr_bits(key, static_cast<uint32_t>(idx)));
  }
}

// True if x[begin, end) has no inf or NaN: the exponent field is all ones exactly for those.
template <DType D>
bool finite_range(const Storage<D>* x, int64_t begin, int64_t end) {
  int64_t i = begin;
  if constexpr (D == DType::f32) {
    const uint32_t* u = reinterpret_cast<const uint32_t*>(x);
#if defined(__AVX512F__)
    const __m512i e = _mm512_set1_epi32(0x7f800000);
    __mmask16 bad = 0;
    for (; i + 16 <= end; i += 16)
      bad |= _mm512_cmpeq_epi32_mask(_mm512_and_si512(_mm512_loadu_si512(u + i), e), e);
    if (i < end) {
      const __mmask16 m = vec::tail_mask(end - i);
      bad |= _mm512_mask_cmpeq_epi32_mask(
          m, _mm512_and_si512(_mm512_maskz_loadu_epi32(m, u + i), e), e);
      i = end;
    }
    if (bad) return false;
#endif
    for (; i < end; ++i)
      if ((u[i] & 0x7f800000u) == 0x7f800000u) return false;
  } else {
    const uint16_t e = D == DType::bf16 ? 0x7f80 : 0x7c00;
#if defined(__AVX512F__)
    const __m512i ev = _mm512_set1_epi16(static_cast<short>(e));
    __mmask32 bad = 0;
    for (; i + 32 <= end; i += 32)
      bad |= _mm512_cmpeq_epi16_mask(_mm512_and_si512(_mm512_loadu_si512(x + i), ev), ev);
    if (i < end) {
      const __mmask32 m = static_cast<__mmask32>(end - i >= 32 ? ~0u : (1u << (end - i)) - 1u);
      bad |= _mm512_mask_cmpeq_epi16_mask(
          m, _mm512_and_si512(_mm512_maskz_loadu_epi16(m, x + i), ev), ev);
      i = end;
    }
    if (bad) return false;
#endif
    for (; i < end; ++i)
      if ((x[i] & e) == e) return false;
  }
  return true;
}

}  // namespace

void convert(Tensor& dst, const Tensor& src) {
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
  half::dispatch(src.dtype(), [&](auto s) {
    half::dispatch(dst.dtype(), [&](auto d) {
      constexpr DType S = decltype(s)::value, D = decltype(d)::value;
      const auto* x = static_cast<const Storage<S>*>(src.raw_data());
      auto* y = static_cast<Storage<D>*>(dst.raw_data());
      parallel_ranges(src.numel(), [&](int64_t begin, int64_t end) {
        half::convert_n<S, D>(y + begin, x + begin, end - begin);
      });
    });
  });
}

void convert_stochastic(Tensor& dst, const Tensor& src, uint64_t seed, uint64_t index0) {
  constexpr std::string_view op = "convert_stochastic";
  expect_any_shape(src, op, "src", DType::f32);
  expect_any_shape(dst, op, "dst", DType::bf16);
  MEMFIT_CHECK_SHAPE(dst.numel() == src.numel(), op, "dst {} and src {} differ in element count",
                     dst.shape(), src.shape());
  const float* x = src.data<float>();
  auto* y = static_cast<uint16_t*>(dst.raw_data());
  parallel_ranges(src.numel(), [&](int64_t begin, int64_t end) {
    stochastic_range(y, x, begin, end, seed, index0);
  });
}

bool all_finite(const Tensor& t) {
  expect_float(t, "all_finite", "t");
  return half::dispatch(t.dtype(), [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    const auto* x = static_cast<const Storage<D>*>(t.raw_data());
    // Each range's verdict as 0 / 1; the sum counts ranges with a non-finite element.
    return parallel_sum(t.numel(), [&](int64_t begin, int64_t end) {
             return finite_range<D>(x, begin, end) ? 0.0 : 1.0;
           }) == 0.0;
  });
}

UnscaleResult unscale_and_check(Tensor& grads, float inv_scale) {
  expect_any_shape(grads, "unscale_and_check", "grads", DType::f32);
  float* g = grads.data<float>();
  const double sum = parallel_sum(grads.numel(), [&](int64_t begin, int64_t end) {
    int64_t i = begin;
    double total = 0.0;
#if defined(__AVX512F__)
    // As sum_squares: squares of floats are exact in double, two accumulators.
    const __m512 s = _mm512_set1_ps(inv_scale);
    __m512d acc0 = _mm512_setzero_pd(), acc1 = _mm512_setzero_pd();
    for (; i + 16 <= end; i += 16) {
      const __m512 x = _mm512_mul_ps(_mm512_loadu_ps(g + i), s);
      _mm512_storeu_ps(g + i, x);
      const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
      const __m512d hi =
          _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
      acc0 = _mm512_fmadd_pd(lo, lo, acc0);
      acc1 = _mm512_fmadd_pd(hi, hi, acc1);
    }
    total = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
#endif
    for (; i < end; ++i) {
      g[i] *= inv_scale;
      total += static_cast<double>(g[i]) * g[i];
    }
    return total;
  });
  // A sum of squares of floats in double is finite exactly when every float is: the largest
  // square is below 2^256, so even 2^60 of them cannot overflow.
  return {std::isfinite(sum), sum};
}

}  // namespace memfit::kernels
