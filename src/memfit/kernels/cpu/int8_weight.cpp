// Int8 weights: the per-row quantization and the dequantization in one source for every SIMD
// target (simd.h), and the layout of the buffer. See Note [Int8 weights].
#include "memfit/kernels/cpu/int8_weight.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/int8_weight.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {
namespace {

using DI = hn::RebindToSigned<DF>;

// One row of n values at x: its absmax (NaN ignored) to *absmax, its codes to code, each
// int8_code(x, 127 / absmax): x times the reciprocal, clamped to +-127, rounded to nearest
// even, NaN as 0.
template <DType S>
void quantize_row(const half::Storage<S>* x, int64_t n, int8_t* code, float* absmax) {
  const DF d;
  const DI di;
  const hn::Rebind<int8_t, DF> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF vmax = hn::Zero(d);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const VF v = load<S>(d, x + i);
    vmax = hn::Max(vmax, hn::IfThenElseZero(hn::Eq(v, v), hn::Abs(v)));
  }
  float m = max_lanes(d, vmax);
  for (; i < n; ++i) m = std::fmax(m, std::fabs(half::load1<S>(x + i)));
  *absmax = m;
  const float inv = static_cast<float>(kInt8CodeMax) / m;
  const VF vinv = hn::Set(d, inv), hi = hn::Set(d, float{kInt8CodeMax}), lo = hn::Neg(hi);
  i = 0;
  for (; i + N <= n; i += N) {
    const VF s = hn::Mul(load<S>(d, x + i), vinv);
    // NaN lanes to 0 first (Min and Max need not keep a NaN), then the clamp and the rounding.
    const VF c = hn::Min(hi, hn::Max(lo, hn::IfThenElseZero(hn::Eq(s, s), s)));
    const VF r = hn::Round(c);
    hn::StoreU(hn::DemoteTo(d8, hn::ConvertTo(di, r)), d8, code + i);
  }
  for (; i < n; ++i) code[i] = int8_code(half::load1<S>(x + i), inv);
}

// What a dequantized value is written as: f32, bf16, or f32 holding the bf16-rounded value.
enum class Out : int { f32, bf16, f32_of_bf16 };

template <Out O>
HWY_INLINE void put1(void* dst, int64_t o, float v) {
  if constexpr (O == Out::f32)
    static_cast<float*>(dst)[o] = v;
  else if constexpr (O == Out::bf16)
    static_cast<uint16_t*>(dst)[o] = bf16_from_f32(v);
  else
    static_cast<float*>(dst)[o] = f32_from_bf16(bf16_from_f32(v));
}

// Elements [e0, e0 + n) of w to dst: code * the scale of its row (int8_row_scale), a row's
// segment at a time.
template <Out O>
void dequantize(const Int8Weight& w, int64_t e0, int64_t n, void* dst) {
  const DF d;
  const DI di;
  const hn::Rebind<int8_t, DF> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const int64_t end = e0 + n;
  int64_t e = e0;
  while (e < end) {
    const int64_t r = e / w.cols, seg_end = std::min(end, (r + 1) * w.cols);
    const float a = int8_row_scale(w.absmax[r]);
    const VF va = hn::Set(d, a);
    for (; e + N <= seg_end; e += N) {
      const VF c = hn::ConvertTo(d, hn::PromoteTo(di, hn::LoadU(d8, w.codes + e)));
      const VF v = hn::Mul(c, va);
      if constexpr (O == Out::f32) {
        hn::StoreU(v, d, static_cast<float*>(dst) + (e - e0));
      } else if constexpr (O == Out::bf16) {
        store_u16(d, bf16_bits(d, v), static_cast<uint16_t*>(dst) + (e - e0));
      } else {
        const VF rv = hn::BitCast(d, hn::ShiftLeft<16>(bf16_bits(d, v)));
        hn::StoreU(rv, d, static_cast<float*>(dst) + (e - e0));
      }
    }
    for (; e < seg_end; ++e)
      put1<O>(dst, e - e0, static_cast<float>(w.codes[e]) * a);
  }
}

// Rows [r0, r1) of the columns [c0, c0 + t) to dst, row after row (t a row).
template <Out O>
void dequantize_rect(const Int8Weight& w, int64_t r0, int64_t r1, int64_t c0, int64_t t,
                     void* dst) {
  const size_t esize = O == Out::bf16 ? 2 : 4;
  for (int64_t r = r0; r < r1; ++r)
    dequantize<O>(w, r * w.cols + c0, t, static_cast<char*>(dst) + (r - r0) * t * esize);
}

}  // namespace

void Int8QuantizeF32(const float* x, int64_t rows, int64_t cols, int8_t* codes, float* absmax) {
  for (int64_t r = 0; r < rows; ++r)
    quantize_row<DType::f32>(x + r * cols, cols, codes + r * cols, absmax + r);
}
void Int8QuantizeBf16(const uint16_t* x, int64_t rows, int64_t cols, int8_t* codes,
                      float* absmax) {
  for (int64_t r = 0; r < rows; ++r)
    quantize_row<DType::bf16>(x + r * cols, cols, codes + r * cols, absmax + r);
}

void Int8Dequantize(const Int8Weight& w, int64_t r0, int64_t r1, int64_t c0, int64_t t, int out,
                    void* dst) {
  switch (static_cast<Out>(out)) {
    case Out::f32: return dequantize_rect<Out::f32>(w, r0, r1, c0, t, dst);
    case Out::bf16: return dequantize_rect<Out::bf16>(w, r0, r1, c0, t, dst);
    case Out::f32_of_bf16: return dequantize_rect<Out::f32_of_bf16>(w, r0, r1, c0, t, dst);
  }
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/dequant_args.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(Int8QuantizeF32);
HWY_EXPORT(Int8QuantizeBf16);
HWY_EXPORT(Int8Dequantize);

namespace {
constexpr const char* kOp = "int8";
}  // namespace

int8_t int8_code(float x, float inv) {
  const float s = x * inv;
  if (std::isnan(s)) return 0;
  const float c = std::clamp(s, -float{kInt8CodeMax}, float{kInt8CodeMax});
  return static_cast<int8_t>(std::nearbyint(c));  // the default mode: to nearest, ties to even
}

Int8Layout int8_layout(int64_t rows, int64_t cols) {
  MEMFIT_CHECK_SHAPE(rows > 0 && cols > 0, kOp, "a weight needs rows and columns, got ({}, {})",
                     rows, cols);
  Int8Layout l;
  l.rows = rows;
  l.cols = cols;
  l.absmax_at = (static_cast<size_t>(rows * cols) + 3) / 4 * 4;
  l.bytes = l.absmax_at + 4 * static_cast<size_t>(rows);
  return l;
}

size_t int8_bytes(int64_t rows, int64_t cols) { return int8_layout(rows, cols).bytes; }

Int8Weight Int8Weight::view(void* storage, int64_t rows, int64_t cols) {
  const Int8Layout l = int8_layout(rows, cols);
  MEMFIT_CHECK(storage != nullptr && reinterpret_cast<uintptr_t>(storage) % 4 == 0, kOp,
               "storage of a ({}, {}) weight must be 4-byte aligned", rows, cols);
  auto* base = static_cast<uint8_t*>(storage);
  Int8Weight w;
  w.rows = rows;
  w.cols = cols;
  w.codes = reinterpret_cast<int8_t*>(base);
  w.absmax = reinterpret_cast<float*>(base + l.absmax_at);
  return w;
}

Int8Weight Int8Weight::view(const Tensor& storage, int64_t rows, int64_t cols) {
  expect_any_shape(storage, kOp, "storage", DType::u8);
  MEMFIT_CHECK_SHAPE(storage.nbytes() >= int8_bytes(rows, cols), kOp,
                     "a ({}, {}) weight needs {} bytes, the storage has {}", rows, cols,
                     int8_bytes(rows, cols), storage.nbytes());
  return view(storage.raw_data(), rows, cols);
}

void int8_quantize_rows(const Tensor& rows, int64_t row0, Int8Weight& w) {
  KernelScope timed("int8_quantize");
  constexpr const char* op = "int8_quantize";
  const Shape& s = expect_float_any_shape(rows, op, "rows");
  MEMFIT_CHECK_DTYPE(rows.dtype() != DType::f16, op, "rows must be f32 or bf16, got f16");
  MEMFIT_CHECK_SHAPE(s.rank() == 2 && s[1] == w.cols && row0 >= 0 && row0 + s[0] <= w.rows, op,
                     "rows {} from row {} do not fit a ({}, {}) weight", s, row0, w.rows,
                     w.cols);
  const int64_t k = s[0], cols = w.cols;
  const bool bf16 = rows.dtype() == DType::bf16;
  const auto* x = static_cast<const char*>(rows.raw_data());
  const size_t esize = bf16 ? 2 : 4;
  // Rows per task: at least 16 KiB of input.
  const int64_t per = std::max<int64_t>(1, 4096 / cols);
  const int64_t tasks = (k + per - 1) / per;
  simd_ensure_init();
#pragma omp parallel for schedule(static) if (k * cols >= kParallelGrain)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t r = t * per, n = std::min(per, k - r);
    const void* xr = x + static_cast<size_t>(r * cols) * esize;
    int8_t* codes = w.codes + (row0 + r) * cols;
    float* absmax = w.absmax + row0 + r;
    if (bf16)
      HWY_DYNAMIC_DISPATCH(Int8QuantizeBf16)(static_cast<const uint16_t*>(xr), n, cols, codes,
                                             absmax);
    else
      HWY_DYNAMIC_DISPATCH(Int8QuantizeF32)(static_cast<const float*>(xr), n, cols, codes,
                                            absmax);
  }
}

void int8_quantize(const Tensor& src, Int8Weight& w) {
  MEMFIT_CHECK_SHAPE(src.shape() == Shape({w.rows, w.cols}), "int8_quantize",
                     "src {} must be the weight's ({}, {})", src.shape(), w.rows, w.cols);
  int8_quantize_rows(src, 0, w);
}

void int8_dequantize_n(const Int8Weight& w, int64_t e0, int64_t n, DType dst_type, void* dst,
                       bool round_bf16) {
  constexpr std::string_view op = "int8_dequantize";
  const int out = dequant_out_form(op, dst_type, round_bf16);
  check_dequant_range(op, w.rows, w.cols, e0, n);
  // One "row" of n elements: the range may span rows of W (dequantize finds each one's).
  if (n > 0) MEMFIT_SIMD_DISPATCH(Int8Dequantize)(w, 0, 1, e0, n, out, dst);
}

void int8_dequantize_tile(const Int8Weight& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                          DType dst_type, void* dst, bool round_bf16) {
  constexpr std::string_view op = "int8_dequantize";
  const int out = dequant_out_form(op, dst_type, round_bf16);
  check_dequant_tile(op, w.rows, w.cols, r0, r1, c0, c1);
  if (r1 > r0 && c1 > c0) MEMFIT_SIMD_DISPATCH(Int8Dequantize)(w, r0, r1, c0, c1 - c0, out, dst);
}

void int8_dequantize_rows(const Int8Weight& w, int64_t row0, Tensor& dst) {
  dequantize_rows_into("int8_dequantize", w.rows, w.cols, row0, dst,
                       [&](int64_t e0, int64_t n, DType t, void* out) {
                         int8_dequantize_n(w, e0, n, t, out);
                       });
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
