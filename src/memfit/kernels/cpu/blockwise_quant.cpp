// Block-wise 8-bit quantisation: the dynamic maps, nearest-entry search (one source for every SIMD target, simd.h)
// and the block and tensor loops. See Note [8-bit optimizers].
#include "memfit/kernels/cpu/blockwise_quant.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/blockwise_quant.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <cmath>

#include "memfit/kernels/cpu/simd-inl.h"

#if HWY_TARGET <= HWY_AVX3 && !defined(MEMFIT_BLOCKWISE_QUANT_IMMINTRIN_)
#define MEMFIT_BLOCKWISE_QUANT_IMMINTRIN_
// GCC 12.2's AVX-512 headers trip -Wuninitialized on their own "undefined" operands (GCC
// PR105593, fixed in 12.3); the warning is reported at the header's lines, so silence it there.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop
#endif

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {
namespace {

#if HWY_TARGET <= HWY_AVX3
// AVX3 (and any later AVX-512 target) keeps the 256 thresholds in 16 registers and looks them
// up with two-table permutes, which Highway 1.0.3 has no portable form of; the other targets
// gather from memory. Both make exactly QuantMap::nearest's comparisons, so every target gives
// the same codes.
// map.search_tree in 16 registers.
struct SearchRegs {
  __m512 t[16];
  explicit SearchRegs(const QuantMap& map) {
    for (int r = 0; r < 16; ++r) t[r] = _mm512_load_ps(map.search_tree.data() + 16 * r);
  }
};

// Entry idx (0..63) of a 64-float table held in registers t[0..3].
inline __m512 lookup64(const __m512* t, __m512i idx) {
  __m512 lo = _mm512_permutex2var_ps(t[0], idx, t[1]);
  __m512 hi = _mm512_permutex2var_ps(t[2], idx, t[3]);
  return _mm512_mask_blend_ps(_mm512_test_epi32_mask(idx, _mm512_set1_epi32(32)), lo, hi);
}

// map.nearest for 16 lanes: the same eight comparisons, thresholds looked up by permutes.
inline __m512i nearest16(__m512 x, const SearchRegs& s) {
  const __m512i one = _mm512_set1_epi32(1);
  // Levels 1-5 pick j (0..31) among thresholds[8j + 7].
  __m512i j = _mm512_setzero_si512();
  for (int step = 16; step >= 1; step >>= 1) {
    __m512i probe = _mm512_add_epi32(j, _mm512_set1_epi32(step - 1));
    __m512 t = _mm512_permutex2var_ps(s.t[0], probe, s.t[1]);
    j = _mm512_mask_add_epi32(j, _mm512_cmp_ps_mask(x, t, _CMP_GT_OQ), j, _mm512_set1_epi32(step));
  }
  // Level 6: thresholds[8j + 3].
  __m512 t6 = _mm512_permutex2var_ps(s.t[2], j, s.t[3]);
  __m512i k = _mm512_mask_add_epi32(_mm512_slli_epi32(j, 1), _mm512_cmp_ps_mask(x, t6, _CMP_GT_OQ),
                                    _mm512_slli_epi32(j, 1), one);  // 2j + b6
  // Level 7: thresholds[8j + 4 b6 + 1], a 64-entry table.
  __m512 t7 = lookup64(s.t + 4, k);
  k = _mm512_slli_epi32(k, 1);
  k = _mm512_mask_add_epi32(k, _mm512_cmp_ps_mask(x, t7, _CMP_GT_OQ), k, one);  // 4j + 2 b6 + b7
  // Level 8: thresholds[8j + 4 b6 + 2 b7], a 128-entry table.
  __m512 t8 = _mm512_mask_blend_ps(_mm512_test_epi32_mask(k, _mm512_set1_epi32(64)),
                                   lookup64(s.t + 8, k), lookup64(s.t + 12, k));
  k = _mm512_slli_epi32(k, 1);
  return _mm512_mask_add_epi32(k, _mm512_cmp_ps_mask(x, t8, _CMP_GT_OQ), k, one);
}

#endif

// map.nearest for every lane: eight halving steps over the thresholds, each a gather.
template <class D>
HWY_INLINE hn::Vec<hn::RebindToSigned<D>> nearest_gather(D d, hn::Vec<D> x, const float* th) {
  const hn::RebindToSigned<D> di;
  auto idx = hn::Zero(di);
  for (int step = 128; step >= 1; step >>= 1) {
    const auto t = hn::GatherIndex(d, th + step - 1, idx);
    idx = hn::Add(idx, hn::IfThenElseZero(hn::RebindMask(di, hn::Gt(x, t)), hn::Set(di, step)));
  }
  return idx;
}

}  // namespace

float QuantizeBlock(const float* x, int64_t n, const QuantMap& map, uint8_t* q) {
  const DF d;
  const hn::Rebind<uint8_t, DF> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  int64_t i = 0;
  VF vmax = hn::Zero(d);
  for (; i + N <= n; i += N) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(d, x + i)));
  float absmax = max_lanes(d, vmax);
  for (; i < n; ++i) absmax = std::max(absmax, std::fabs(x[i]));
  const float inv = absmax > 0.0f ? 1.0f / absmax : 0.0f;
  const VF vinv = hn::Set(d, inv);
#if HWY_TARGET <= HWY_AVX3
  const SearchRegs regs(map);
#endif
  for (i = 0; i + N <= n; i += N) {
    const VF xs = hn::Mul(hn::LoadU(d, x + i), vinv);
#if HWY_TARGET <= HWY_AVX3
    const auto idx = hn::Vec<hn::RebindToSigned<DF>>{nearest16(xs.raw, regs)};
#else
    const auto idx = nearest_gather(d, xs, map.thresholds.data());
#endif
    hn::StoreU(hn::DemoteTo(d8, idx), d8, q + i);
  }
  for (; i < n; ++i) q[i] = map.nearest(x[i] * inv);
  return absmax;
}

void DequantizeBlock(const uint8_t* q, int64_t n, float absmax, const QuantMap& map, float* x) {
  const DF d;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF va = hn::Set(d, absmax);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto idx = hn::PromoteTo(di, hn::LoadU(d8, q + i));
    hn::StoreU(hn::Mul(hn::GatherIndex(d, map.values.data(), idx), va), d, x + i);
  }
  for (; i < n; ++i) x[i] = map.values[q[i]] * absmax;
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <limits>
#include <vector>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(QuantizeBlock);
HWY_EXPORT(DequantizeBlock);

uint8_t QuantMap::nearest(float x) const {
  // Count the thresholds below x: eight halving steps over the 255 thresholds (the 256th, +inf,
  // is never passed). Every SIMD target makes exactly the same comparisons.
  // Branch-free: the comparisons are data-dependent coin flips, which a branch mispredicts.
  int idx = 0;
  for (int step = 128; step >= 1; step >>= 1)
    idx += step & -static_cast<int>(x > thresholds[idx + step - 1]);
  return static_cast<uint8_t>(idx);
}

QuantMap make_dynamic_map(bool is_signed) {
  // bitsandbytes' create_dynamic_map with max_exponent_bits = 7, total_bits = 8. Decade i
  // (scale 10^(i-6)) splits [0.1, 1] evenly into 2^i pieces (signed; 2^(i+1) unsigned) and
  // keeps the midpoint of each piece, so larger decades get finer steps. 127 (signed: times
  // two, mirrored) + 0 + 1.0 = 256 entries; the "additional items" of the general construction
  // are 2^(7 - 7) - 1 = 0 here.
  constexpr int kExponentBits = 7;
  std::vector<double> data;
  for (int i = 0; i < kExponentBits; ++i) {
    int pieces = is_signed ? (1 << i) : (1 << (i + 1));
    double scale = std::pow(10.0, i - (kExponentBits - 1));
    for (int k = 0; k < pieces; ++k) {
      double lo = 0.1 + 0.9 * k / pieces, hi = 0.1 + 0.9 * (k + 1) / pieces;
      double mid = scale * (lo + hi) / 2.0;
      data.push_back(mid);
      if (is_signed) data.push_back(-mid);
    }
  }
  data.push_back(0.0);
  data.push_back(1.0);
  MEMFIT_CHECK(data.size() == kQuantCodes, "quant", "dynamic map has {} entries, expected {}",
               data.size(), kQuantCodes);
  std::sort(data.begin(), data.end());

  QuantMap map;
  map.is_signed = is_signed;
  for (int i = 0; i < kQuantCodes; ++i) map.values[i] = static_cast<float>(data[i]);
  for (int i = 0; i + 1 < kQuantCodes; ++i)
    map.thresholds[i] =
        static_cast<float>((static_cast<double>(map.values[i]) + map.values[i + 1]) / 2.0);
  map.thresholds[kQuantCodes - 1] = std::numeric_limits<float>::infinity();
  auto& tree = map.search_tree;
  for (int j = 0; j < 32; ++j) {
    tree[j] = map.thresholds[8 * j + 7];
    tree[32 + j] = map.thresholds[8 * j + 3];
    for (int b6 = 0; b6 < 2; ++b6) {
      tree[64 + 2 * j + b6] = map.thresholds[8 * j + 4 * b6 + 1];
      for (int b7 = 0; b7 < 2; ++b7)
        tree[128 + 4 * j + 2 * b6 + b7] = map.thresholds[8 * j + 4 * b6 + 2 * b7];
    }
  }
  return map;
}

const QuantMap& signed_dynamic_map() {
  static const QuantMap map = make_dynamic_map(true);
  return map;
}
const QuantMap& unsigned_dynamic_map() {
  static const QuantMap map = make_dynamic_map(false);
  return map;
}

float quantize_block_reference(const float* x, int64_t n, const QuantMap& map, uint8_t* q) {
  float absmax = 0.0f;
  for (int64_t i = 0; i < n; ++i) absmax = std::max(absmax, std::fabs(x[i]));
  float inv = absmax > 0.0f ? 1.0f / absmax : 0.0f;
  for (int64_t i = 0; i < n; ++i) q[i] = map.nearest(x[i] * inv);
  return absmax;
}

float quantize_block(const float* x, int64_t n, const QuantMap& map, uint8_t* q) {
  return MEMFIT_SIMD_DISPATCH(QuantizeBlock)(x, n, map, q);
}

void dequantize_block(const uint8_t* q, int64_t n, float absmax, const QuantMap& map, float* x) {
  MEMFIT_SIMD_DISPATCH(DequantizeBlock)(q, n, absmax, map, x);
}

namespace {

void check_quant_args(const Tensor& x, const Tensor& q, const Tensor& absmax, const char* op) {
  expect_any_shape(x, op, "x", DType::f32);
  expect_any_shape(q, op, "q", DType::i8);
  expect_any_shape(absmax, op, "absmax", DType::f32);
  MEMFIT_CHECK_SHAPE(q.numel() == x.numel() && absmax.numel() == quant_blocks(x.numel()), op,
                     "x {} needs q of {} and absmax of {} values, got q {} and absmax {}",
                     x.shape(), x.numel(), quant_blocks(x.numel()), q.shape(), absmax.shape());
}
}  // namespace

void quantize_blockwise(const Tensor& x, Tensor& q, Tensor& absmax, const QuantMap& map) {
  KernelScope timed("quantize_blockwise");
  check_quant_args(x, q, absmax, "quantize_blockwise");
  const int64_t n = x.numel(), blocks = quant_blocks(n);
  const float* xp = x.data<float>();
  uint8_t* qp = reinterpret_cast<uint8_t*>(q.data<int8_t>());
  float* ap = absmax.data<float>();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t off = b * kQuantBlock;
    ap[b] = quantize_block(xp + off, std::min(kQuantBlock, n - off), map, qp + off);
  }
}

void dequantize_blockwise(const Tensor& q, const Tensor& absmax, const QuantMap& map, Tensor& x) {
  KernelScope timed("dequantize_blockwise");
  check_quant_args(x, q, absmax, "dequantize_blockwise");
  const int64_t n = x.numel(), blocks = quant_blocks(n);
  float* xp = x.data<float>();
  const uint8_t* qp = reinterpret_cast<const uint8_t*>(q.data<int8_t>());
  const float* ap = absmax.data<float>();
#pragma omp parallel for schedule(static) if (n >= kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    int64_t off = b * kQuantBlock;
    dequantize_block(qp + off, std::min(kQuantBlock, n - off), ap[b], map, xp + off);
  }
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
