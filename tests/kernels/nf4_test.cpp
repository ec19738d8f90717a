// NF4 weights (kernels/cpu/nf4.h): the byte count, the code book's decision rule, the SIMD
// quantization and dequantization against the scalar reference bit for bit (whichever target
// the dispatch chose; CTest reruns this under MEMFIT_MAX_ISA=avx2 and scalar), odd shapes and
// tail blocks, streaming in row pieces, bf16 input, the double-quantized scales, round-trip
// error bounds, and the argument checks.
#include "memfit/kernels/cpu/nf4.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/kernels/cpu/blockwise_quant.h"
#include "memfit/kernels/ref/nf4_ref.h"
#include "nf4_test_util.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using test::OwnedNf4;
using test::weight_values;

// (rows, cols) with tails of every kind: a single element, odd counts (a padding nibble),
// blocks that span rows, partial last blocks of 64 and of 256 blocks.
const std::vector<std::pair<int64_t, int64_t>> kShapes = {
    {1, 1},   {1, 2},    {1, 63},  {1, 64},   {1, 65},  {3, 37},
    {5, 100}, {17, 1000}, {64, 256}, {300, 64}, {2, 4099}, {257, 128}};

Tensor f32_tensor(MemoryPool& pool, int64_t rows, int64_t cols, const std::vector<float>& x) {
  Tensor t = test::make_tensor(pool, {rows, cols});
  std::copy(x.begin(), x.end(), t.data<float>());
  return t;
}

Tensor absmax_scratch(MemoryPool& pool, int64_t rows, int64_t cols) {
  const auto floats = static_cast<int64_t>(nf4_quantize_scratch_bytes(rows, cols) / 4);
  return test::make_tensor(pool, {floats});
}

void quantize(MemoryPool& pool, const std::vector<float>& x, OwnedNf4& q) {
  Tensor src = f32_tensor(pool, q.w.rows, q.w.cols, x);
  Tensor scratch = absmax_scratch(pool, q.w.rows, q.w.cols);
  nf4_quantize(src, q.w, scratch);
}

TEST(Nf4Format, BytesPerParameter) {
  // 4096 x 4096: 2^23 code bytes, 2^18 block bytes, 2^10 scales, the offset.
  EXPECT_EQ(nf4_bytes(4096, 4096), 8388608u + 262144u + 4096u + 4u);
  // Bits per parameter: 4 + 8/64 + 32/(64 * 256), and the offset's 32 bits per tensor.
  const double n = 4096.0 * 4096.0;
  EXPECT_DOUBLE_EQ(8.0 * static_cast<double>(nf4_bytes(4096, 4096)) / n,
                   4.0 + 8.0 / 64 + 32.0 / (64 * 256) + 32.0 / n);
  // 4096 x 11008 (LLaMA-2 7B's MLP): 704512 blocks, 2752 scales.
  EXPECT_EQ(nf4_bytes(4096, 11008), 22544384u + 704512u + 11008u + 4u);
  // (5, 37): 185 values in 93 bytes, 3 blocks (bytes 93-95), scales at 96, offset at 100.
  const Nf4Layout l = nf4_layout(5, 37);
  EXPECT_EQ(l.code_bytes, 93u);
  EXPECT_EQ(l.blocks, 3);
  EXPECT_EQ(l.qabsmax_at, 93u);
  EXPECT_EQ(l.scales_at, 96u);
  EXPECT_EQ(l.offset_at, 100u);
  EXPECT_EQ(l.bytes, 104u);
  EXPECT_EQ(nf4_layout(300, 64).scale_blocks, 2);  // 300 blocks: 256 + a partial 44
  EXPECT_THROW(nf4_bytes(0, 64), ShapeError);
}

TEST(Nf4Format, CodeIsTheNearestValue) {
  for (int i = 0; i < 16; ++i) EXPECT_EQ(nf4_code(kNf4Values[i]), i);
  for (int i = 0; i < 15; ++i) {
    // A threshold itself goes to the lower code (x > t is false); the next float up, higher.
    EXPECT_EQ(nf4_code(kNf4Thresholds[i]), i);
    EXPECT_EQ(nf4_code(std::nextafter(kNf4Thresholds[i], 2.0f)), i + 1);
  }
  for (int k = -1100; k <= 1100; ++k) {
    const float x = static_cast<float>(k) / 1000.0f;
    const int c = nf4_code(x);
    double best = 1e9;
    for (float v : kNf4Values) best = std::min(best, std::fabs(static_cast<double>(x) - v));
    EXPECT_LE(std::fabs(static_cast<double>(x) - kNf4Values[c]), best + 1e-7) << x;
  }
  EXPECT_EQ(nf4_code(std::numeric_limits<float>::quiet_NaN()), 0);
}

TEST(Nf4Quantize, FastMatchesReferenceBitForBit) {
  MemoryPool pool;
  for (auto [rows, cols] : kShapes) {
    for (bool zeros : {false, true}) {
      const auto x = weight_values(rows, cols, static_cast<uint32_t>(rows * 31 + cols), zeros);
      OwnedNf4 fast(rows, cols), ref(rows, cols);
      quantize(pool, x, fast);
      ref::nf4_quantize(x.data(), ref.w);
      EXPECT_TRUE(fast.same_bytes(ref)) << rows << " x " << cols << " zeros " << zeros;

      const int64_t n = rows * cols;
      std::vector<float> want(static_cast<size_t>(n)), want_bf(static_cast<size_t>(n));
      ref::nf4_dequantize(ref.w, want.data());
      ref::nf4_dequantize(ref.w, want_bf.data(), true);
      Tensor got = test::make_tensor(pool, {rows, cols});
      Tensor got_bf = test::make_tensor(pool, {rows, cols}, DType::bf16);
      nf4_dequantize_rows(fast.w, 0, got);
      nf4_dequantize_rows(fast.w, 0, got_bf);
      const auto* g = got.data<float>();
      const auto* gb = static_cast<const uint16_t*>(got_bf.raw_data());
      int64_t bad = 0, bad_bf = 0;
      for (int64_t i = 0; i < n; ++i) {
        bad += test::bits_of(g[i]) != test::bits_of(want[static_cast<size_t>(i)]);
        bad_bf += f32_from_bf16(gb[i]) != want_bf[static_cast<size_t>(i)];
      }
      EXPECT_EQ(bad, 0) << rows << " x " << cols;
      EXPECT_EQ(bad_bf, 0) << rows << " x " << cols;
    }
  }
}

TEST(Nf4Dequantize, AnyRangeMatchesTheWhole) {
  // Row pieces and element ranges at odd starts (a low nibble first) and odd lengths, in every
  // output form, against the whole tensor's reference.
  MemoryPool pool;
  const int64_t rows = 9, cols = 301;
  const auto x = weight_values(rows, cols, 5);
  OwnedNf4 q(rows, cols);
  quantize(pool, x, q);
  std::vector<float> want(x.size()), want_bf(x.size());
  ref::nf4_dequantize(q.w, want.data());
  ref::nf4_dequantize(q.w, want_bf.data(), true);
  for (int64_t r0 : {0, 1, 4, 8}) {
    Tensor part = test::make_tensor(pool, {rows - r0 > 3 ? 3 : rows - r0, cols});
    nf4_dequantize_rows(q.w, r0, part);
    for (int64_t i = 0; i < part.numel(); ++i)
      ASSERT_EQ(part.data<float>()[i], want[static_cast<size_t>(r0 * cols + i)]) << r0 << " " << i;
  }
  for (int64_t e0 : {0, 1, 63, 64, 65, 127, 1000, 2708}) {
    for (int64_t len : {1, 2, 15, 16, 17, 33, 200}) {
      const int64_t n = std::min(len, rows * cols - e0);
      std::vector<float> f(static_cast<size_t>(n)), fr(static_cast<size_t>(n));
      std::vector<uint16_t> h(static_cast<size_t>(n));
      nf4_dequantize_n(q.w, e0, n, DType::f32, f.data());
      nf4_dequantize_n(q.w, e0, n, DType::f32, fr.data(), true);
      nf4_dequantize_n(q.w, e0, n, DType::bf16, h.data());
      for (int64_t i = 0; i < n; ++i) {
        const auto k = static_cast<size_t>(e0 + i), j = static_cast<size_t>(i);
        ASSERT_EQ(f[j], want[k]) << e0 << "+" << i;
        ASSERT_EQ(fr[j], want_bf[k]) << e0 << "+" << i;
        ASSERT_EQ(f32_from_bf16(h[j]), want_bf[k]) << e0 << "+" << i;
      }
    }
  }
}

TEST(Nf4Dequantize, TilesMatchTheWhole) {
  // Rectangles of W (the input gradient's column tiles), odd columns included, written densely.
  MemoryPool pool;
  const int64_t rows = 13, cols = 323;
  const auto x = weight_values(rows, cols, 6);
  OwnedNf4 q(rows, cols);
  quantize(pool, x, q);
  std::vector<float> want(x.size());
  ref::nf4_dequantize(q.w, want.data());
  for (auto [c0, c1] : {std::pair<int64_t, int64_t>{0, 128}, {128, 256}, {256, 323}, {1, 2},
                        {37, 100}}) {
    for (auto [r0, r1] : {std::pair<int64_t, int64_t>{0, 13}, {5, 6}, {3, 11}}) {
      std::vector<float> f(static_cast<size_t>((r1 - r0) * (c1 - c0)));
      std::vector<uint16_t> h(f.size());
      nf4_dequantize_tile(q.w, r0, r1, c0, c1, DType::f32, f.data());
      nf4_dequantize_tile(q.w, r0, r1, c0, c1, DType::bf16, h.data());
      for (int64_t r = r0; r < r1; ++r)
        for (int64_t c = c0; c < c1; ++c) {
          const auto j = static_cast<size_t>((r - r0) * (c1 - c0) + (c - c0));
          const float v = want[static_cast<size_t>(r * cols + c)];
          ASSERT_EQ(f[j], v) << r << "," << c;
          ASSERT_EQ(h[j], bf16_from_f32(v)) << r << "," << c;
        }
    }
  }
  float buf[8];
  EXPECT_TRUE(test::throws_with<ShapeError>(
      [&] { nf4_dequantize_tile(q.w, 0, 1, 320, 324, DType::f32, buf); }, {"columns [320, 324)"}));
}

TEST(Nf4Quantize, RowPiecesEqualTheWhole) {
  // A load that streams the weight in: pieces of rows in any order, then the second level.
  MemoryPool pool;
  const int64_t rows = 40, cols = 96;  // a block is 2/3 of a row: pieces of 2 rows start blocks
  const auto x = weight_values(rows, cols, 11);
  OwnedNf4 whole(rows, cols), pieces(rows, cols);
  quantize(pool, x, whole);
  Tensor scratch = absmax_scratch(pool, rows, cols);
  const std::pair<int64_t, int64_t> ranges[] = {{38, 40}, {0, 2}, {10, 24}, {2, 10}, {24, 38}};
  for (auto [r0, r1] : ranges) {
    std::vector<float> part(x.begin() + r0 * cols, x.begin() + r1 * cols);
    Tensor t = f32_tensor(pool, r1 - r0, cols, part);
    nf4_quantize_rows(t, r0, pieces.w, scratch);
  }
  nf4_quantize_absmax(scratch, pieces.w);
  EXPECT_TRUE(pieces.same_bytes(whole));
  // A piece must start a block: row 1 starts at element 96.
  Tensor one = f32_tensor(pool, 1, cols, std::vector<float>(x.begin(), x.begin() + cols));
  EXPECT_TRUE(test::throws_with<ShapeError>(
      [&] { nf4_quantize_rows(one, 1, pieces.w, scratch); }, {"[nf4_quantize]", "block of 64"}));
}

TEST(Nf4Quantize, Bf16InputEqualsItsF32Widening) {
  MemoryPool pool;
  for (auto [rows, cols] : {std::pair<int64_t, int64_t>{3, 37}, {8, 512}, {2, 4099}}) {
    auto x = weight_values(rows, cols, 21);
    Tensor bf = test::make_tensor(pool, {rows, cols}, DType::bf16);
    auto* h = static_cast<uint16_t*>(bf.raw_data());
    for (size_t i = 0; i < x.size(); ++i) {
      h[i] = bf16_from_f32(x[i]);
      x[i] = f32_from_bf16(h[i]);
    }
    OwnedNf4 from_bf(rows, cols), from_f32(rows, cols);
    Tensor scratch = absmax_scratch(pool, rows, cols);
    nf4_quantize(bf, from_bf.w, scratch);
    quantize(pool, x, from_f32);
    EXPECT_TRUE(from_bf.same_bytes(from_f32)) << rows << " x " << cols;
  }
}

TEST(Nf4Quantize, DoubleQuantizedScales) {
  // offset = mean absmax; scale of each 256-block = max |absmax - offset|; the dequantized
  // absmax within the dynamic map's worst rounding (half its widest gap) of the scale.
  MemoryPool pool;
  const int64_t rows = 300, cols = 128;  // 600 blocks: 256 + 256 + 88
  const auto x = weight_values(rows, cols, 3);
  OwnedNf4 q(rows, cols);
  Tensor src = f32_tensor(pool, rows, cols, x);
  Tensor scratch = absmax_scratch(pool, rows, cols);
  nf4_quantize_rows(src, 0, q.w, scratch);
  const std::vector<float> absmax(scratch.data<float>(), scratch.data<float>() + q.w.blocks());
  for (int64_t b = 0; b < q.w.blocks(); ++b) {
    float m = 0.0f;
    for (int64_t e = b * 64; e < (b + 1) * 64; ++e) m = std::max(m, std::fabs(x[e]));
    ASSERT_EQ(absmax[static_cast<size_t>(b)], m) << b;
  }
  nf4_quantize_absmax(scratch, q.w);
  double sum = 0.0;
  for (float a : absmax) sum += a;
  EXPECT_EQ(*q.w.offset, static_cast<float>(sum / static_cast<double>(absmax.size())));
  ASSERT_EQ(nf4_layout(rows, cols).scale_blocks, 3);
  double half_gap = 0.0;
  const QuantMap& map = signed_dynamic_map();
  for (int i = 0; i + 1 < 256; ++i)
    half_gap = std::max(half_gap, (static_cast<double>(map.values[i + 1]) - map.values[i]) / 2);
  for (int64_t s = 0; s < 3; ++s) {
    float want = 0.0f;
    for (int64_t b = s * 256; b < std::min<int64_t>(600, (s + 1) * 256); ++b)
      want = std::max(want, std::fabs(absmax[static_cast<size_t>(b)] - *q.w.offset));
    EXPECT_EQ(q.w.scales[s], want) << s;
    EXPECT_GT(want, 0.0f);
  }
  for (int64_t b = 0; b < q.w.blocks(); ++b) {
    const double err = std::fabs(static_cast<double>(q.w.block_absmax(b)) - absmax[b]);
    ASSERT_LE(err, half_gap * q.w.scales[b / 256] * (1 + 1e-6) + 1e-7 * absmax[b]) << b;
  }
}

TEST(Nf4Quantize, RoundTripErrorBound) {
  // |w' - w| <= |absmax' - absmax| + absmax * (widest NF4 half gap, (1 - 0.6961928) / 2), and
  // the RMS error of normal data relative to its RMS is what 4 bits give (0.092 for N(0, 1) in
  // blocks of 64, by a numpy simulation; double quantization adds little).
  MemoryPool pool;
  const int64_t rows = 64, cols = 1024;
  const auto x = weight_values(rows, cols, 8, false, /*outliers=*/false);
  OwnedNf4 q(rows, cols);
  Tensor src = f32_tensor(pool, rows, cols, x);
  Tensor scratch = absmax_scratch(pool, rows, cols);
  nf4_quantize_rows(src, 0, q.w, scratch);
  const std::vector<float> absmax(scratch.data<float>(), scratch.data<float>() + q.w.blocks());
  nf4_quantize_absmax(scratch, q.w);
  double gap = 0.0;
  for (int i = 0; i + 1 < 16; ++i)
    gap = std::max(gap, (static_cast<double>(kNf4Values[i + 1]) - kNf4Values[i]) / 2);
  EXPECT_NEAR(gap, 0.1519036, 1e-6);
  Tensor out = test::make_tensor(pool, {rows, cols});
  nf4_dequantize_rows(q.w, 0, out);
  double sq_err = 0.0, sq = 0.0;
  for (int64_t e = 0; e < rows * cols; ++e) {
    const int64_t b = e / 64;
    const double a = absmax[b], a2 = q.w.block_absmax(b);
    const double err = std::fabs(static_cast<double>(out.data<float>()[e]) - x[e]);
    ASSERT_LE(err, std::fabs(a2 - a) + a * gap * (1 + 1e-6)) << e;
    sq_err += err * err;
    sq += static_cast<double>(x[e]) * x[e];
  }
  EXPECT_LT(std::sqrt(sq_err / sq), 0.095);
}

TEST(Nf4Quantize, ZeroAndSingleBlocks) {
  // An all-zero block: absmax 0, 1/0 = inf, 0 * inf a NaN, code 0 (-1), as bitsandbytes; it
  // dequantizes to -absmax', the second level's small error around 0, not 0. One block alone:
  // absmax - offset = 0, scale 0, its byte the NaN's index 0, and the absmax comes back as the
  // offset exactly.
  MemoryPool pool;
  std::vector<float> x(129, 0.0f);
  for (int i = 0; i < 64; ++i) x[i] = static_cast<float>(i % 7 - 3) * 0.25f;
  OwnedNf4 q(1, 129);
  quantize(pool, x, q);
  for (int64_t i = 32; i < 65; ++i) EXPECT_EQ(q.w.codes[i], 0) << i;
  Tensor out = test::make_tensor(pool, {1, 129});
  nf4_dequantize_rows(q.w, 0, out);
  for (int64_t i = 64; i < 129; ++i) EXPECT_EQ(out.data<float>()[i], -q.w.block_absmax(i / 64));
  EXPECT_LT(std::fabs(q.w.block_absmax(1)), 0.01f * 0.75f);
  OwnedNf4 one(1, 64);
  quantize(pool, std::vector<float>(x.begin(), x.begin() + 64), one);
  EXPECT_EQ(*one.w.offset, 0.75f);
  EXPECT_EQ(one.w.scales[0], 0.0f);
  EXPECT_EQ(one.w.qabsmax[0], 0);
  EXPECT_EQ(one.w.block_absmax(0), 0.75f);
}

TEST(Nf4Checks, RejectWrongArguments) {
  MemoryPool pool;
  OwnedNf4 q(4, 64);
  Tensor scratch = absmax_scratch(pool, 4, 64);
  Tensor wrong = test::make_tensor(pool, {4, 65});
  EXPECT_TRUE(test::throws_with<ShapeError>([&] { nf4_quantize(wrong, q.w, scratch); },
                                            {"[nf4_quantize]", "(4, 64)"}));
  Tensor small = test::make_tensor(pool, {3});
  Tensor src = test::make_tensor(pool, {4, 64});
  EXPECT_TRUE(test::throws_with<ShapeError>([&] { nf4_quantize(src, q.w, small); },
                                            {"absmax_scratch", "4 blocks"}));
  Tensor f16 = test::make_tensor(pool, {4, 64}, DType::f16);
  EXPECT_THROW(nf4_quantize(f16, q.w, scratch), DTypeError);
  Tensor out = test::make_tensor(pool, {2, 64});
  EXPECT_TRUE(test::throws_with<ShapeError>([&] { nf4_dequantize_rows(q.w, 3, out); },
                                            {"[nf4_dequantize]", "from row 3"}));
  float buf[4];
  EXPECT_THROW(nf4_dequantize_n(q.w, 255, 2, DType::f32, buf), ShapeError);
  Tensor bytes = Tensor::empty(pool, {static_cast<int64_t>(nf4_bytes(4, 64)) - 1}, DType::u8,
                               Category::params, "nf4");
  EXPECT_TRUE(test::throws_with<ShapeError>([&] { Nf4Weight::view(bytes, 4, 64); },
                                            {"needs 140 bytes"}));
}

}  // namespace
}  // namespace memfit::kernels
