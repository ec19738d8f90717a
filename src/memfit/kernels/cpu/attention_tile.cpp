// Micro-kernel and softmax helpers for CPU attention, one source for every SIMD target
// (simd.h). The micro-kernel keeps a rows x (NV vectors) tile of C in registers, loads NV
// vectors of B per k and broadcasts one A element per row; the row count follows the target's
// register file (32 vectors on AVX3, 16 on AVX2). Softmax's exp is simd-inl.h's.
#include "memfit/kernels/cpu/attention_tile.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/attention_tile.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include <algorithm>
#include <limits>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {
namespace {

// Rows per tile by vector count: accumulators + B vectors + one broadcast stay within the
// register file. Columns are at most kMaxWidth = 64 floats: 4 vectors on AVX3, 8 on AVX2.
#if HWY_TARGET <= HWY_AVX3
constexpr int kMaxVecs = 4;
constexpr int kRowsFor[kMaxVecs + 1] = {0, 16, 12, 8, 6};
#else
constexpr int kMaxVecs = 8;
constexpr int kRowsFor[kMaxVecs + 1] = {0, 12, 6, 4, 3, 2, 2, 1, 1};
#endif

int vecs_for(int n) {
  const int L = static_cast<int>(hn::Lanes(DF()));
  return std::clamp((n + L - 1) / L, 1, kMaxVecs);
}

template <int R, int NV>
void tile_kernel(int64_t K, const float* A, int64_t as, int64_t ak, const float* B, int64_t ldb,
                 float* C, int64_t ldc, int n, float alpha, bool accumulate) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  VF acc[R][NV];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = hn::Zero(d);
  const auto last = hn::FirstN(d, static_cast<size_t>(n - L * (NV - 1)));
  for (int64_t k = 0; k < K; ++k) {
    const float* b = B + k * ldb;
    VF bv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV - 1; ++v) bv[v] = hn::LoadU(d, b + L * v);
    bv[NV - 1] = hn::MaskedLoad(last, d, b + L * (NV - 1));
    const float* a = A + k * ak;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const VF av = hn::Set(d, a[r * as]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = hn::MulAdd(av, bv[v], acc[r][v]);
    }
  }
  const VF al = hn::Set(d, alpha);
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      float* c = C + r * ldc + L * v;
      VF x = hn::Mul(acc[r][v], al);
      if (v == NV - 1) {
        if (accumulate) x = hn::Add(x, hn::MaskedLoad(last, d, c));
        hn::BlendedStore(x, last, d, c);
      } else {
        if (accumulate) x = hn::Add(x, hn::LoadU(d, c));
        hn::StoreU(x, d, c);
      }
    }
  }
}

// Picks the kernel for `rows` (<= kRowsFor[NV]) by walking down from the widest.
template <int NV, int R = kRowsFor[NV]>
void run_rows(int rows, int64_t K, const float* A, int64_t as, int64_t ak, const float* B,
              int64_t ldb, float* C, int64_t ldc, int n, float alpha, bool accumulate) {
  if constexpr (R > 1) {
    if (rows < R)
      return run_rows<NV, R - 1>(rows, K, A, as, ak, B, ldb, C, ldc, n, alpha, accumulate);
  }
  tile_kernel<R, NV>(K, A, as, ak, B, ldb, C, ldc, n, alpha, accumulate);
}

template <int... NV>
void run_any(int nv, int rows, int64_t K, const float* A, int64_t as, int64_t ak, const float* B,
             int64_t ldb, float* C, int64_t ldc, int n, float alpha, bool accumulate,
             std::integer_sequence<int, NV...>) {
  ((nv == NV + 1 ? run_rows<NV + 1>(rows, K, A, as, ak, B, ldb, C, ldc, n, alpha, accumulate)
                 : void()),
   ...);
}

}  // namespace

int64_t TileMaxRows(int n) { return kRowsFor[vecs_for(n)]; }

// Columns in chunks of kMaxVecs vectors (one chunk on AVX3 and AVX2; the scalar target's
// vectors hold one float).
void TileRun(int rows, int n, int64_t K, const float* A, int64_t as, int64_t ak, const float* B,
         int64_t ldb, float* C, int64_t ldc, float alpha, bool accumulate) {
  const int W = kMaxVecs * static_cast<int>(hn::Lanes(DF()));
  for (int j0 = 0; j0 < n; j0 += W) {
    const int w = std::min(W, n - j0);
    run_any(vecs_for(w), rows, K, A, as, ak, B + j0, ldb, C + j0, ldc, w, alpha, accumulate,
            std::make_integer_sequence<int, kMaxVecs>{});
  }
}

float TileRowMax(const float* x, int64_t n) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  VF m = hn::Set(d, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + L <= n; i += L) m = hn::Max(m, hn::LoadU(d, x + i));
  float r = max_lanes(d, m);
  for (; i < n; ++i) r = std::max(r, x[i]);
  return r;
}

float TileExpShiftSum(float* x, int64_t n, float shift) {
  const DF d;
  const int64_t L = static_cast<int64_t>(hn::Lanes(d));
  const VF s = hn::Set(d, shift);
  VF sum = hn::Zero(d);
  int64_t i = 0;
  for (; i + L <= n; i += L) {
    const VF e = exp(d, hn::Sub(hn::LoadU(d, x + i), s));
    hn::StoreU(e, d, x + i);
    sum = hn::Add(sum, e);
  }
  if (i < n) {
    const VF e = hn::IfThenElseZero(hn::FirstN(d, static_cast<size_t>(n - i)),
                                    exp(d, hn::Sub(load_n<DType::f32>(d, x + i, n - i), s)));
    store_n<DType::f32>(d, e, x + i, n - i);
    sum = hn::Add(sum, e);
  }
  return sum_lanes(d, sum);
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include "memfit/kernels/cpu/flash_attention_tiles.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(TileMaxRows);
HWY_EXPORT(TileRun);
HWY_EXPORT(TileRowMax);
HWY_EXPORT(TileExpShiftSum);
}  // namespace memfit::kernels

namespace memfit::kernels::tile {

int64_t max_rows(int n) { return MEMFIT_SIMD_DISPATCH(TileMaxRows)(n); }

void run(int rows, int n, int64_t K, const float* A, int64_t as, int64_t ak, const float* B,
         int64_t ldb, float* C, int64_t ldc, float alpha, bool accumulate) {
  MEMFIT_SIMD_DISPATCH(TileRun)(rows, n, K, A, as, ak, B, ldb, C, ldc, alpha, accumulate);
}

// A block of keys laid out along the keys: flash attention's transpose (16 x 16 blocks in
// registers on AVX3), with no padding columns to fill.
void transpose(const float* src, int64_t lds, int64_t rows, int64_t cols, float* dst,
               int64_t ldd) {
  for (int64_t i0 = 0; i0 < rows; i0 += flash::kLanes) {
    const int nr = static_cast<int>(std::min<int64_t>(flash::kLanes, rows - i0));
    if (nr == flash::kLanes) {
      flash::transpose_padded(dst + i0, ldd, src + i0 * lds, lds, nr, static_cast<int>(cols));
    } else {
      for (int64_t i = i0; i < rows; ++i)
        for (int64_t j = 0; j < cols; ++j) dst[j * ldd + i] = src[i * lds + j];
    }
  }
}

float row_max(const float* x, int64_t n) { return MEMFIT_SIMD_DISPATCH(TileRowMax)(x, n); }

float exp_shift_sum(float* x, int64_t n, float shift) {
  return MEMFIT_SIMD_DISPATCH(TileExpShiftSum)(x, n, shift);
}

}  // namespace memfit::kernels::tile
#endif  // HWY_ONCE
