// Int8 weights (kernels/cpu/int8_weight.h): the byte count, the code of known vectors (ties to
// even, the row's absmax at +-127), zero rows, extremes (NaN, inf, the largest and subnormal
// floats), the SIMD quantization and dequantization against the scalar reference bit for bit
// (whichever target the dispatch chose; CTest reruns this under MEMFIT_MAX_ISA=avx2 and
// scalar), odd shapes, streaming in row pieces, bf16 input, the round-trip error bound, and the
// argument checks.
#include "memfit/kernels/cpu/int8_weight.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <cmath>
#include <limits>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/kernels/cpu/quant_weight.h"
#include "memfit/kernels/ref/int8_ref.h"
#include "quant_test_util.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using test::weight_values;

// (rows, cols): a single element, widths below, at and past a vector of 8 and 16 lanes,
// widths whose codes end off a 4-byte boundary (the absmax after padding).
const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {1, 1}, {1, 7}, {1, 16}, {3, 17}, {5, 37}, {17, 1000}, {64, 256}, {2, 4099}, {257, 128}};

struct OwnedInt8 {
  std::vector<uint32_t> storage;
  Int8Weight w;
  OwnedInt8(int64_t rows, int64_t cols)
      : storage((int8_bytes(rows, cols) + 3) / 4, 0u),
        w(Int8Weight::view(storage.data(), rows, cols)) {}
  size_t size() const { return int8_bytes(w.rows, w.cols); }
  bool same_bytes(const OwnedInt8& o) const {
    return size() == o.size() && std::memcmp(storage.data(), o.storage.data(), size()) == 0;
  }
};

Tensor f32_tensor(MemoryPool& pool, int64_t rows, int64_t cols, const std::vector<float>& x) {
  Tensor t = test::make_tensor(pool, {rows, cols});
  std::copy(x.begin(), x.end(), t.data<float>());
  return t;
}

TEST(Int8Format, BytesPerParameter) {
  // 4096 x 4096: a byte a weight and an f32 a row.
  EXPECT_EQ(int8_bytes(4096, 4096), 16777216u + 4u * 4096);
  // (5, 37): 185 codes, padded to 188, then 5 absmax.
  const Int8Layout l = int8_layout(5, 37);
  EXPECT_EQ(l.absmax_at, 188u);
  EXPECT_EQ(l.bytes, 208u);
  EXPECT_EQ(quant_bytes(WeightQuant::int8, 5, 37), 208u);
  EXPECT_THROW(int8_bytes(0, 64), ShapeError);
  EXPECT_THROW(int8_bytes(3, 0), ShapeError);
}

TEST(Int8Quantize, KnownVectors) {
  // absmax 4: 127 / 4 = 31.75 exactly, so every product below is exact.
  const std::vector<float> x = {4.0f, -2.0f, 1.0f, 0.03125f, -4.0f, 0.0f, 0.5f / 31.75f * 4.0f};
  OwnedInt8 q(1, static_cast<int64_t>(x.size()));
  MemoryPool pool;
  Tensor src = f32_tensor(pool, 1, q.w.cols, x);
  int8_quantize(src, q.w);
  EXPECT_EQ(q.w.absmax[0], 4.0f);
  EXPECT_EQ(q.w.codes[0], 127);
  EXPECT_EQ(q.w.codes[1], -64);  // -63.5: to even
  EXPECT_EQ(q.w.codes[2], 32);   // 31.75
  EXPECT_EQ(q.w.codes[3], 1);    // 0.9921875
  EXPECT_EQ(q.w.codes[4], -127);
  EXPECT_EQ(q.w.codes[5], 0);
  EXPECT_EQ(q.w.codes[6], int8_code(x[6], 31.75f));  // about 2 (x * 31.75 rounded in f32)
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(q.w.codes[i], int8_code(x[i], 31.75f)) << i;
  // Ties: 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -0.5 -> 0 (nearbyint's default mode).
  EXPECT_EQ(int8_code(0.5f, 1.0f), 0);
  EXPECT_EQ(int8_code(1.5f, 1.0f), 2);
  EXPECT_EQ(int8_code(2.5f, 1.0f), 2);
  EXPECT_EQ(int8_code(-0.5f, 1.0f), 0);
  EXPECT_EQ(int8_code(-2.5f, 1.0f), -2);
  // Beyond the range (an overflowed inverse scale): clamped.
  EXPECT_EQ(int8_code(1.0f, std::numeric_limits<float>::infinity()), 127);
  EXPECT_EQ(int8_code(-1.0f, std::numeric_limits<float>::infinity()), -127);
  EXPECT_EQ(int8_code(std::numeric_limits<float>::quiet_NaN(), 1.0f), 0);
  // Dequantization: code * (absmax * kInt8InvMax), the row's scale rounded once.
  std::vector<float> out(x.size());
  int8_dequantize_n(q.w, 0, q.w.cols, DType::f32, out.data());
  const float scale = 4.0f * kInt8InvMax;
  EXPECT_EQ(int8_row_scale(4.0f), scale);
  for (size_t i = 0; i < x.size(); ++i)
    EXPECT_EQ(out[i], static_cast<float>(q.w.codes[i]) * scale) << i;
  EXPECT_NEAR(out[0], 4.0f, 1e-6f);
  EXPECT_NEAR(out[1], -2.0157480f, 1e-6f);  // -64 * 4 / 127
  EXPECT_EQ(kInt8InvMax, static_cast<float>(1.0 / 127.0));
}

TEST(Int8Quantize, ZeroRowsAndExtremes) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float big = std::numeric_limits<float>::max();
  const float sub = std::numeric_limits<float>::denorm_min();
  const int64_t cols = 21;  // past a vector of 16, a scalar tail
  std::vector<float> x(static_cast<size_t>(6 * cols), 0.0f);
  auto row = [&](int64_t r) { return x.begin() + r * cols; };
  // Row 0: zeros (absmax 0: 0 * inf is a NaN, code 0, and dequantized 0, not NaN).
  // Row 1: the largest float and its negation, a subnormal (code 0).
  row(1)[3] = big;
  row(1)[17] = -big;
  row(1)[20] = sub;
  // Row 2: subnormals alone (127 / absmax overflows to inf: codes +-127 and 0 for the zeros).
  row(2)[0] = sub;
  row(2)[19] = -sub;
  // Row 3: a NaN (ignored by the absmax, code 0) among ordinary values.
  row(3)[5] = nan;
  row(3)[6] = -4.0f;
  row(3)[18] = 2.0f;  // 2 x 31.75 = 63.5 exactly
  // Row 4: an inf (absmax inf: 127 / inf = 0, every code 0 or NaN's 0).
  row(4)[2] = inf;
  row(4)[8] = 2.0f;
  // Row 5: the negative extreme alone.
  row(5)[20] = -7.0f;
  MemoryPool pool;
  OwnedInt8 got(6, cols), want(6, cols);
  Tensor src = f32_tensor(pool, 6, cols, x);
  int8_quantize(src, got.w);
  ref::int8_quantize(x.data(), want.w);
  EXPECT_TRUE(got.same_bytes(want));
  EXPECT_EQ(got.w.absmax[0], 0.0f);
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(got.w.codes[c], 0);
  EXPECT_EQ(got.w.absmax[1], big);
  EXPECT_EQ(got.w.codes[cols + 3], 127);
  EXPECT_EQ(got.w.codes[cols + 17], -127);
  EXPECT_EQ(got.w.codes[cols + 20], 0);
  EXPECT_EQ(got.w.absmax[2], sub);
  EXPECT_EQ(got.w.codes[2 * cols + 0], 127);
  EXPECT_EQ(got.w.codes[2 * cols + 19], -127);
  EXPECT_EQ(got.w.codes[2 * cols + 1], 0);
  EXPECT_EQ(got.w.absmax[3], 4.0f);
  EXPECT_EQ(got.w.codes[3 * cols + 5], 0);
  EXPECT_EQ(got.w.codes[3 * cols + 6], -127);
  EXPECT_EQ(got.w.codes[3 * cols + 18], 64);  // 63.5: to even
  EXPECT_EQ(got.w.absmax[4], inf);
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(got.w.codes[4 * cols + c], 0);
  EXPECT_EQ(got.w.codes[5 * cols + 20], -127);
  // Dequantized: the zero row is zeros; the largest floats come back finite and within a step.
  std::vector<float> out(x.size());
  int8_dequantize_n(got.w, 0, 6 * cols, DType::f32, out.data());
  for (int64_t c = 0; c < cols; ++c) EXPECT_EQ(out[static_cast<size_t>(c)], 0.0f);
  EXPECT_TRUE(std::isfinite(out[static_cast<size_t>(cols + 3)]));
  EXPECT_NEAR(out[static_cast<size_t>(cols + 3)] / big, 1.0, 1e-6);
  std::vector<float> ref_out(x.size());
  ref::int8_dequantize(want.w, ref_out.data());
  for (size_t i = 0; i < x.size(); ++i)
    if (!std::isnan(ref_out[i])) {
      EXPECT_EQ(out[i], ref_out[i]) << i;
    }
}

TEST(Int8Quantize, FastMatchesReferenceBitForBit) {
  MemoryPool pool;
  for (const auto& [rows, cols] : kShapes) {
    SCOPED_TRACE(::testing::Message() << rows << "x" << cols);
    const auto x = weight_values(rows, cols, static_cast<uint32_t>(rows * 31 + cols));
    OwnedInt8 got(rows, cols), want(rows, cols);
    Tensor src = f32_tensor(pool, rows, cols, x);
    int8_quantize(src, got.w);
    ref::int8_quantize(x.data(), want.w);
    ASSERT_TRUE(got.same_bytes(want));
    // Dequantized: f32, bf16 and f32-of-bf16, every element as the reference.
    std::vector<float> want_f(x.size()), want_r(x.size());
    ref::int8_dequantize(want.w, want_f.data());
    ref::int8_dequantize(want.w, want_r.data(), true);
    Tensor f = test::make_tensor(pool, {rows, cols});
    Tensor h = test::make_tensor(pool, {rows, cols}, DType::bf16);
    int8_dequantize_rows(got.w, 0, f);
    int8_dequantize_rows(got.w, 0, h);
    const auto* hb = static_cast<const uint16_t*>(h.raw_data());
    int64_t bad = 0;
    for (int64_t i = 0; i < rows * cols; ++i) {
      bad += f.data<float>()[i] != want_f[static_cast<size_t>(i)];
      bad += f32_from_bf16(hb[i]) != want_r[static_cast<size_t>(i)];
    }
    EXPECT_EQ(bad, 0);
  }
}

TEST(Int8Dequantize, AnyRangeAndTileMatchTheWhole) {
  MemoryPool pool;
  const int64_t rows = 9, cols = 45;
  OwnedInt8 q(rows, cols);
  const auto x = weight_values(rows, cols, 3);
  Tensor src = f32_tensor(pool, rows, cols, x);
  int8_quantize(src, q.w);
  std::vector<float> want(x.size()), want_r(x.size());
  ref::int8_dequantize(q.w, want.data());
  ref::int8_dequantize(q.w, want_r.data(), true);
  // Ranges that start anywhere and span rows.
  for (const auto& [e0, n] : {std::pair<int64_t, int64_t>{0, 405}, {1, 44}, {44, 2}, {7, 100},
                              {200, 205}, {404, 1}}) {
    std::vector<float> f(static_cast<size_t>(n)), fr(static_cast<size_t>(n));
    std::vector<uint16_t> h(static_cast<size_t>(n));
    int8_dequantize_n(q.w, e0, n, DType::f32, f.data());
    int8_dequantize_n(q.w, e0, n, DType::f32, fr.data(), true);
    int8_dequantize_n(q.w, e0, n, DType::bf16, h.data());
    for (int64_t i = 0; i < n; ++i) {
      const auto k = static_cast<size_t>(e0 + i), j = static_cast<size_t>(i);
      ASSERT_EQ(f[j], want[k]) << e0 << "+" << i;
      ASSERT_EQ(fr[j], want_r[k]) << e0 << "+" << i;
      ASSERT_EQ(f32_from_bf16(h[j]), want_r[k]) << e0 << "+" << i;
    }
  }
  // Rectangles, densely (row stride c1 - c0).
  for (const auto& [r0, r1, c0, c1] : {std::array<int64_t, 4>{0, 9, 0, 45}, {2, 7, 3, 40},
                                       {8, 9, 44, 45}, {0, 9, 17, 18}}) {
    const int64_t t = c1 - c0;
    std::vector<float> f(static_cast<size_t>((r1 - r0) * t));
    std::vector<uint16_t> h(f.size());
    int8_dequantize_tile(q.w, r0, r1, c0, c1, DType::f32, f.data());
    int8_dequantize_tile(q.w, r0, r1, c0, c1, DType::bf16, h.data());
    for (int64_t r = r0; r < r1; ++r)
      for (int64_t c = c0; c < c1; ++c) {
        const auto j = static_cast<size_t>((r - r0) * t + (c - c0));
        const float v = want[static_cast<size_t>(r * cols + c)];
        ASSERT_EQ(f[j], v) << r << "," << c;
        ASSERT_EQ(h[j], bf16_from_f32(v)) << r << "," << c;
      }
  }
}

TEST(Int8Quantize, RowPiecesAndBf16Input) {
  MemoryPool pool;
  const int64_t rows = 37, cols = 70;
  const auto x = weight_values(rows, cols, 12);
  OwnedInt8 whole(rows, cols), pieces(rows, cols);
  Tensor src = f32_tensor(pool, rows, cols, x);
  int8_quantize(src, whole.w);
  // Pieces of any whole rows, in any order.
  for (const auto& [r0, k] : {std::pair<int64_t, int64_t>{30, 7}, {0, 1}, {1, 12}, {13, 17}}) {
    Tensor part = src.view(r0 * cols, {k, cols});
    int8_quantize_rows(part, r0, pieces.w);
  }
  EXPECT_TRUE(whole.same_bytes(pieces));
  // bf16 input: the same bytes as its exact f32 widening.
  Tensor bf = test::make_tensor(pool, {rows, cols}, DType::bf16);
  std::vector<float> widened(x.size());
  auto* h = static_cast<uint16_t*>(bf.raw_data());
  for (size_t i = 0; i < x.size(); ++i) {
    h[i] = bf16_from_f32(x[i]);
    widened[i] = f32_from_bf16(h[i]);
  }
  OwnedInt8 from_bf(rows, cols), from_f(rows, cols);
  int8_quantize(bf, from_bf.w);
  Tensor wsrc = f32_tensor(pool, rows, cols, widened);
  int8_quantize(wsrc, from_f.w);
  EXPECT_TRUE(from_bf.same_bytes(from_f));
}

TEST(Int8Quantize, RoundTripErrorIsHalfAStep) {
  // |dequantized - x| <= absmax / 254 (half a step of absmax / 127) plus the f32 roundings of
  // the scaling and the dequantization (a few ulp of absmax).
  MemoryPool pool;
  const int64_t rows = 50, cols = 300;
  const auto x = weight_values(rows, cols, 8);
  OwnedInt8 q(rows, cols);
  Tensor src = f32_tensor(pool, rows, cols, x);
  int8_quantize(src, q.w);
  Tensor f = test::make_tensor(pool, {rows, cols});
  int8_dequantize_rows(q.w, 0, f);
  double worst = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const double a = q.w.absmax[r];
    for (int64_t c = 0; c < cols; ++c) {
      const double e =
          std::fabs(f.data<float>()[r * cols + c] - x[static_cast<size_t>(r * cols + c)]);
      EXPECT_LE(e, a / 254.0 + 4 * a * std::ldexp(1.0, -24)) << r << "," << c;
      worst = std::max(worst, e / a);
    }
  }
  EXPECT_GT(worst, 1.0 / 254.0 * 0.9);  // the bound is nearly reached: it is the right one
}

TEST(Int8Checks, RejectWrongArguments) {
  MemoryPool pool;
  OwnedInt8 q(4, 64);
  Tensor wrong = test::make_tensor(pool, {4, 63});
  EXPECT_THROW(int8_quantize(wrong, q.w), ShapeError);
  Tensor rows = test::make_tensor(pool, {2, 64});
  EXPECT_THROW(int8_quantize_rows(rows, 3, q.w), ShapeError);  // rows 3..5 of 4
  Tensor f16 = test::make_tensor(pool, {4, 64}, DType::f16);
  EXPECT_THROW(int8_quantize(f16, q.w), DTypeError);
  float buf[8];
  EXPECT_THROW(int8_dequantize_n(q.w, 255, 2, DType::f32, buf), ShapeError);
  EXPECT_TRUE(test::throws_with<ShapeError>(
      [&] { int8_dequantize_tile(q.w, 0, 1, 60, 66, DType::f32, buf); }, {"columns [60, 66)"}));
  EXPECT_THROW(int8_dequantize_n(q.w, 0, 2, DType::f16, buf), DTypeError);
  Tensor small = Tensor::empty(pool, {100}, DType::u8, Category::staging, "s");
  EXPECT_THROW((void)Int8Weight::view(small, 4, 64), ShapeError);
}

}  // namespace
}  // namespace memfit::kernels
