// NF4 quantization and dequantization: the 64-value block loops in one source for every SIMD
// target (simd.h), the layout of the buffer and the second level (the absmax values' 8-bit
// quantization, scalar: one value per 64 weights). See Note [NF4 weights].
#include "memfit/kernels/cpu/nf4.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/nf4.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {
namespace {

using DI = hn::RebindToSigned<DF>;

// The codes of the 64 values at x (one per byte) and their absmax (the largest |x|, NaN
// ignored): each value times 1/absmax (f32; 1/0 = inf, and 0 * inf a NaN, code 0, as in
// bitsandbytes), then the count of thresholds below it, exactly nf4_code's comparisons.
template <DType S>
HWY_INLINE float quantize64(const half::Storage<S>* x, uint8_t* code) {
  const DF d;
  const DI di;
  const hn::Rebind<uint8_t, DF> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  VF vmax = hn::Zero(d);
  for (int64_t i = 0; i < kNf4Block; i += N) {
    const VF v = load<S>(d, x + i);
    vmax = hn::Max(vmax, hn::IfThenElseZero(hn::Eq(v, v), hn::Abs(v)));
  }
  const float absmax = max_lanes(d, vmax);
  const VF inv = hn::Set(d, 1.0f / absmax);
  for (int64_t i = 0; i < kNf4Block; i += N) {
    const VF xs = hn::Mul(load<S>(d, x + i), inv);
    auto c = hn::Zero(di);
    for (float t : kNf4Thresholds)  // a true mask is -1: subtracting it counts
      c = hn::Sub(c, hn::VecFromMask(di, hn::RebindMask(di, hn::Gt(xs, hn::Set(d, t)))));
    hn::StoreU(hn::DemoteTo(d8, c), d8, code + i);
  }
  return absmax;
}

// Blocks of the n values at x (a piece of the flattened weight that starts a block): codes
// packed two a byte (the first in the high nibble) from `codes`, absmax from `absmax`. A
// partial last block is quantized as if padded with zeros (bitsandbytes' padded load), so an
// odd n leaves a low nibble holding the code of a zero.
template <DType S>
void quantize_blocks(const half::Storage<S>* x, int64_t n, uint8_t* codes, float* absmax) {
  HWY_ALIGN uint8_t code[kNf4Block];
  for (int64_t b = 0, e = 0; e < n; ++b, e += kNf4Block) {
    const int64_t len = std::min(kNf4Block, n - e);
    if (len == kNf4Block) {
      absmax[b] = quantize64<S>(x + e, code);
    } else {
      HWY_ALIGN half::Storage<S> padded[kNf4Block] = {};
      std::copy(x + e, x + n, padded);
      absmax[b] = quantize64<S>(padded, code);
    }
    uint8_t* out = codes + e / 2;
    for (int64_t j = 0; j < (len + 1) / 2; ++j)
      out[j] = static_cast<uint8_t>(code[2 * j] << 4 | code[2 * j + 1]);
  }
}

#if HWY_TARGET != HWY_SCALAR
// kNf4Values[idx] for every lane: one table permute with 16 lanes, two and a select with 8.
HWY_INLINE VF lookup(DF d, hn::Vec<DI> idx) {
  const DI di;
  if constexpr (hn::MaxLanes(DF()) >= 16) {
    return hn::TableLookupLanes(hn::LoadU(d, kNf4Values.data()), hn::IndicesFromVec(d, idx));
  } else if constexpr (hn::MaxLanes(DF()) == 8) {
    const auto low3 = hn::IndicesFromVec(d, hn::And(idx, hn::Set(di, 7)));
    const VF lo = hn::TableLookupLanes(hn::LoadU(d, kNf4Values.data()), low3);
    const VF hi = hn::TableLookupLanes(hn::LoadU(d, kNf4Values.data() + 8), low3);
    const auto upper = hn::RebindMask(d, hn::Ne(hn::And(idx, hn::Set(di, 8)), hn::Zero(di)));
    return hn::IfThenElse(upper, hi, lo);
  } else {
    return hn::GatherIndex(d, kNf4Values.data(), idx);
  }
}

// The N values of elements [e, e + N) (e even) times a: the bytes [e/2, e/2 + N/2) split into
// nibbles in element order (high, low, high, ...) by widening each byte to 16 bits as
// (byte >> 4) | (byte & 15) << 8, whose little-endian bytes are that order.
HWY_INLINE VF decode(DF d, const uint8_t* codes, int64_t e, float a) {
  const DI di;
  const hn::Rebind<uint8_t, DF> d8;
  const hn::Repartition<uint16_t, decltype(d8)> d16;
  const hn::Rebind<uint8_t, decltype(d16)> d8h;
  const auto b = hn::PromoteTo(d16, hn::LoadU(d8h, codes + e / 2));
  const auto pairs = hn::Or(hn::ShiftRight<4>(b), hn::ShiftLeft<8>(hn::And(b, hn::Set(d16, 15))));
  const auto idx = hn::PromoteTo(di, hn::BitCast(d8, pairs));
  return hn::Mul(lookup(d, idx), hn::Set(d, a));
}
#endif

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

template <Out O>
void dequantize(const Nf4Weight& w, int64_t e0, int64_t n, void* dst) {
  const int64_t end = e0 + n;
#if HWY_TARGET != HWY_SCALAR
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
#endif
  int64_t e = e0;
  while (e < end) {
    const int64_t b = e / kNf4Block, seg_end = std::min(end, (b + 1) * kNf4Block);
    const float a = w.block_absmax(b);
    auto scalar = [&] {
      const int nib = (w.codes[e >> 1] >> ((e & 1) ? 0 : 4)) & 15;
      put1<O>(dst, e - e0, kNf4Values[nib] * a);
      ++e;
    };
#if HWY_TARGET != HWY_SCALAR
    if (e & 1) scalar();
    for (; e + N <= seg_end; e += N) {
      const VF v = decode(d, w.codes, e, a);
      if constexpr (O == Out::f32) {
        hn::StoreU(v, d, static_cast<float*>(dst) + (e - e0));
      } else if constexpr (O == Out::bf16) {
        store_u16(d, bf16_bits(d, v), static_cast<uint16_t*>(dst) + (e - e0));
      } else {
        const VF r = hn::BitCast(d, hn::ShiftLeft<16>(bf16_bits(d, v)));
        hn::StoreU(r, d, static_cast<float*>(dst) + (e - e0));
      }
    }
#endif
    while (e < seg_end) scalar();
  }
}

}  // namespace

void Nf4QuantizeF32(const float* x, int64_t n, uint8_t* codes, float* absmax) {
  quantize_blocks<DType::f32>(x, n, codes, absmax);
}
void Nf4QuantizeBf16(const uint16_t* x, int64_t n, uint8_t* codes, float* absmax) {
  quantize_blocks<DType::bf16>(x, n, codes, absmax);
}
// Rows [r0, r1) of the columns [c0, c0 + t) to dst, row after row (t a row).
template <Out O>
void dequantize_rect(const Nf4Weight& w, int64_t r0, int64_t r1, int64_t c0, int64_t t,
                     void* dst) {
  const size_t esize = O == Out::bf16 ? 2 : 4;
  for (int64_t r = r0; r < r1; ++r)
    dequantize<O>(w, r * w.cols + c0, t, static_cast<char*>(dst) + (r - r0) * t * esize);
}

void Nf4Dequantize(const Nf4Weight& w, int64_t r0, int64_t r1, int64_t c0, int64_t t, int out,
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
#include "memfit/kernels/cpu/blockwise_quant.h"
#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/dequant_args.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(Nf4QuantizeF32);
HWY_EXPORT(Nf4QuantizeBf16);
HWY_EXPORT(Nf4Dequantize);

namespace {
constexpr const char* kOp = "nf4";
// Blocks per task of the quantization loop: 64 KiB of f32 input.
constexpr int64_t kQuantizeChunkBlocks = 256;
}  // namespace

Nf4Layout nf4_layout(int64_t rows, int64_t cols) {
  MEMFIT_CHECK_SHAPE(rows > 0 && cols > 0, kOp, "a weight needs rows and columns, got ({}, {})",
                     rows, cols);
  Nf4Layout l;
  l.rows = rows;
  l.cols = cols;
  l.numel = rows * cols;
  l.blocks = (l.numel + kNf4Block - 1) / kNf4Block;
  l.scale_blocks = (l.blocks + kNf4ScaleBlock - 1) / kNf4ScaleBlock;
  l.code_bytes = static_cast<size_t>((l.numel + 1) / 2);
  l.qabsmax_at = l.code_bytes;
  l.scales_at = (l.qabsmax_at + static_cast<size_t>(l.blocks) + 3) / 4 * 4;
  l.offset_at = l.scales_at + 4 * static_cast<size_t>(l.scale_blocks);
  l.bytes = l.offset_at + 4;
  return l;
}

size_t nf4_bytes(int64_t rows, int64_t cols) { return nf4_layout(rows, cols).bytes; }

Nf4Weight Nf4Weight::view(void* storage, int64_t rows, int64_t cols) {
  const Nf4Layout l = nf4_layout(rows, cols);
  MEMFIT_CHECK(storage != nullptr && reinterpret_cast<uintptr_t>(storage) % 4 == 0, kOp,
               "storage of a ({}, {}) weight must be 4-byte aligned", rows, cols);
  auto* base = static_cast<uint8_t*>(storage);
  Nf4Weight w;
  w.rows = rows;
  w.cols = cols;
  w.codes = base;
  w.qabsmax = base + l.qabsmax_at;
  w.scales = reinterpret_cast<float*>(base + l.scales_at);
  w.offset = reinterpret_cast<float*>(base + l.offset_at);
  return w;
}

Nf4Weight Nf4Weight::view(const Tensor& storage, int64_t rows, int64_t cols) {
  expect_any_shape(storage, kOp, "storage", DType::u8);
  MEMFIT_CHECK_SHAPE(storage.nbytes() >= nf4_bytes(rows, cols), kOp,
                     "a ({}, {}) weight needs {} bytes, the storage has {}", rows, cols,
                     nf4_bytes(rows, cols), storage.nbytes());
  return view(storage.raw_data(), rows, cols);
}

float Nf4Weight::block_absmax(int64_t b) const {
  // The product is rounded to f32 before the offset is added: a volatile keeps the compiler
  // from fusing the two into one multiply-add where the target has FMA.
  volatile float scaled = signed_dynamic_map().values[qabsmax[b]] * scales[b / kNf4ScaleBlock];
  return scaled + *offset;
}

size_t nf4_quantize_scratch_bytes(int64_t rows, int64_t cols) {
  return 4 * static_cast<size_t>(nf4_layout(rows, cols).blocks);
}

namespace {
float* absmax_of(Tensor& scratch, const Nf4Weight& w, const char* op) {
  expect_any_shape(scratch, op, "absmax_scratch", DType::f32);
  MEMFIT_CHECK_SHAPE(scratch.numel() >= w.blocks(), op,
                     "absmax_scratch of {} floats is too small for the {} blocks of ({}, {})",
                     scratch.numel(), w.blocks(), w.rows, w.cols);
  return scratch.data<float>();
}
}  // namespace

void nf4_quantize_rows(const Tensor& rows, int64_t row0, Nf4Weight& w, Tensor& absmax_scratch) {
  KernelScope timed("nf4_quantize");
  constexpr const char* op = "nf4_quantize";
  const Shape& s = expect_float_any_shape(rows, op, "rows");
  MEMFIT_CHECK_DTYPE(rows.dtype() != DType::f16, op, "rows must be f32 or bf16, got f16");
  MEMFIT_CHECK_SHAPE(s.rank() == 2 && s[1] == w.cols && row0 >= 0 && row0 + s[0] <= w.rows, op,
                     "rows {} from row {} do not fit a ({}, {}) weight", s, row0, w.rows,
                     w.cols);
  const int64_t e0 = row0 * w.cols, n = rows.numel();
  MEMFIT_CHECK_SHAPE(e0 % kNf4Block == 0 && ((e0 + n) % kNf4Block == 0 || e0 + n == w.numel()),
                     op,
                     "rows [{}, {}) of a ({}, {}) weight do not start and end at a block of {}",
                     row0, row0 + s[0], w.rows, w.cols, kNf4Block);
  float* absmax = absmax_of(absmax_scratch, w, op) + e0 / kNf4Block;
  uint8_t* codes = w.codes + e0 / 2;
  const bool bf16 = rows.dtype() == DType::bf16;
  const auto* x = static_cast<const char*>(rows.raw_data());
  const size_t esize = bf16 ? 2 : 4;
  constexpr int64_t chunk = kQuantizeChunkBlocks * kNf4Block;
  const int64_t chunks = (n + chunk - 1) / chunk;
  simd_ensure_init();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t off = c * chunk, len = std::min(chunk, n - off);
    const void* xc = x + static_cast<size_t>(off) * esize;
    if (bf16)
      HWY_DYNAMIC_DISPATCH(Nf4QuantizeBf16)(static_cast<const uint16_t*>(xc), len,
                                            codes + off / 2, absmax + off / kNf4Block);
    else
      HWY_DYNAMIC_DISPATCH(Nf4QuantizeF32)(static_cast<const float*>(xc), len, codes + off / 2,
                                           absmax + off / kNf4Block);
  }
}

void nf4_quantize_absmax(Tensor& absmax_scratch, Nf4Weight& w) {
  KernelScope timed("nf4_quantize");
  float* absmax = absmax_of(absmax_scratch, w, "nf4_quantize_absmax");
  const int64_t blocks = w.blocks();
  double sum = 0.0;  // in block order
  for (int64_t b = 0; b < blocks; ++b) sum += absmax[b];
  const float offset = static_cast<float>(sum / static_cast<double>(blocks));
  *w.offset = offset;
  for (int64_t b = 0; b < blocks; ++b) absmax[b] -= offset;
  const QuantMap& map = signed_dynamic_map();
  for (int64_t b0 = 0; b0 < blocks; b0 += kNf4ScaleBlock) {
    const int64_t b1 = std::min(blocks, b0 + kNf4ScaleBlock);
    float scale = 0.0f;
    for (int64_t b = b0; b < b1; ++b) scale = std::max(scale, std::fabs(absmax[b]));
    w.scales[b0 / kNf4ScaleBlock] = scale;
    // As bitsandbytes: times the reciprocal (1/0 = inf; 0 * inf is a NaN, map index 0).
    const float inv = 1.0f / scale;
    for (int64_t b = b0; b < b1; ++b) w.qabsmax[b] = map.nearest(absmax[b] * inv);
  }
}

void nf4_quantize(const Tensor& src, Nf4Weight& w, Tensor& absmax_scratch) {
  MEMFIT_CHECK_SHAPE(src.shape() == Shape({w.rows, w.cols}), "nf4_quantize",
                     "src {} must be the weight's ({}, {})", src.shape(), w.rows, w.cols);
  nf4_quantize_rows(src, 0, w, absmax_scratch);
  nf4_quantize_absmax(absmax_scratch, w);
}

void nf4_dequantize_n(const Nf4Weight& w, int64_t e0, int64_t n, DType dst_type, void* dst,
                      bool round_bf16) {
  constexpr std::string_view op = "nf4_dequantize";
  const int out = dequant_out_form(op, dst_type, round_bf16);
  check_dequant_range(op, w.rows, w.cols, e0, n);
  // One "row" of n elements: the range may span rows of W.
  if (n > 0) MEMFIT_SIMD_DISPATCH(Nf4Dequantize)(w, 0, 1, e0, n, out, dst);
}

void nf4_dequantize_tile(const Nf4Weight& w, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                         DType dst_type, void* dst, bool round_bf16) {
  constexpr std::string_view op = "nf4_dequantize";
  const int out = dequant_out_form(op, dst_type, round_bf16);
  check_dequant_tile(op, w.rows, w.cols, r0, r1, c0, c1);
  if (r1 > r0 && c1 > c0) MEMFIT_SIMD_DISPATCH(Nf4Dequantize)(w, r0, r1, c0, c1 - c0, out, dst);
}

void nf4_dequantize_rows(const Nf4Weight& w, int64_t row0, Tensor& dst) {
  dequantize_rows_into("nf4_dequantize", w.rows, w.cols, row0, dst,
                       [&](int64_t e0, int64_t n, DType t, void* out) {
                         nf4_dequantize_n(w, e0, n, t, out);
                       });
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
