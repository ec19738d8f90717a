// 4-bit AdamW: the fast block-wise and rank-1 updates against the scalar reference over several
// steps and shapes (odd ones: partial blocks, rows that start mid-block); bit for bit where the
// target fuses multiply-adds as the reference does (AVX2, AVX-512), within a few codes and an
// ulp-sized parameter error on the scalar target; the state's error bounds; typed errors.
#include "memfit/kernels/cpu/adamw4bit.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "memfit/kernels/cpu/quant4.h"
#include "memfit/kernels/cpu/simd.h"
#include "memfit/kernels/ref/adamw4bit_ref.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using namespace test;

struct Shape2 {
  int64_t rows, cols;  // rows 0: a 1-D tensor of cols values, block-wise
};

class AdamW4bitFast : public ::testing::TestWithParam<Shape2> {};

TEST_P(AdamW4bitFast, MatchesTheScalarReferenceOverSteps) {
  const auto [rows, cols] = GetParam();
  const int64_t n = rows > 0 ? rows * cols : cols;
  const int64_t bytes = quant4_bytes(n), blocks = quant4_blocks(n);
  const int64_t scales = rows > 0 ? rows + cols : blocks;
  MemoryPool pool;
  const AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  Tensor p = random_tensor(pool, {n}, 31), g = make_tensor(pool, {n});
  Tensor mq = make_tensor(pool, {bytes}, DType::i8), vq = make_tensor(pool, {bytes}, DType::i8);
  Tensor ma = make_tensor(pool, {blocks}), vs = make_tensor(pool, {scales});
  std::vector<float> rp(p.data<float>(), p.data<float>() + n);
  std::vector<uint8_t> rmq(bytes, 0), rvq(bytes, 0);
  std::vector<float> rma(blocks, 0.0f), rvs(scales, 0.0f);
  const bool fused = simd_target() != "SCALAR" && simd_target() != "EMU128";
  for (int64_t t = 1; t <= 4; ++t) {
    std::vector<double> gv = random_values(static_cast<size_t>(n), 40 + uint32_t(t), -0.3, 0.3);
    // Rows of different scale, so the rank-1 scales differ from a block's absmax.
    for (int64_t k = 0; k < n; ++k) gv[k] *= 1.0 + static_cast<double>((k / (cols ? cols : 1)) % 5);
    copy_in(g, gv);
    if (rows > 0)
      adamw4bit_update_rank1(p, g, rows, cols, mq, ma, vq, vs, h, t, 0.5f);
    else
      adamw4bit_update(p, g, mq, ma, vq, vs, h, t, 0.5f);
    ref::adamw4bit_update_ref(rp.data(), g.data<float>(), n, rows, rmq.data(), rma.data(),
                              rvq.data(), rvs.data(), h, t, 0.5f);
    SCOPED_TRACE("step " + std::to_string(t));
    const auto* fq = reinterpret_cast<const uint8_t*>(mq.data<int8_t>());
    const auto* fv = reinterpret_cast<const uint8_t*>(vq.data<int8_t>());
    if (fused) {
      ASSERT_EQ(std::memcmp(p.data<float>(), rp.data(), n * 4), 0) << "params";
      ASSERT_EQ(std::memcmp(fq, rmq.data(), bytes), 0) << "m codes";
      ASSERT_EQ(std::memcmp(fv, rvq.data(), bytes), 0) << "v codes";
      ASSERT_EQ(std::memcmp(ma.data<float>(), rma.data(), blocks * 4), 0) << "m absmax";
      ASSERT_EQ(std::memcmp(vs.data<float>(), rvs.data(), scales * 4), 0) << "v scales";
    } else {
      std::vector<double> want(rp.begin(), rp.end());
      EXPECT_TRUE(all_close(to_doubles(p), want, 1e-5, 1e-5)) << "params";
      int64_t differ = 0;
      for (int64_t k = 0; k < n; ++k)
        differ += (code4_at(fq, k) != code4_at(rmq.data(), k)) +
                  (code4_at(fv, k) != code4_at(rvq.data(), k));
      EXPECT_LE(differ, n / 100 + 2) << "codes";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, AdamW4bitFast,
                         ::testing::Values(Shape2{0, 1}, Shape2{0, 128}, Shape2{0, 4099},
                                           Shape2{1, 130}, Shape2{3, 100}, Shape2{64, 64},
                                           Shape2{37, 129}, Shape2{300, 7}),
                         [](const auto& info) {
                           return std::to_string(info.param.rows) + "x" +
                                  std::to_string(info.param.cols);
                         });

// The decoded second moment stays within half a step of the zero-free map (1/32 of its scale)
// of the f32 one it was quantised from (below the first entry, 1/16, within 1/16), and is never
// decoded as 0 where the scale is not.
TEST(AdamW4bit, Rank1SecondMomentIsWithinHalfAStep) {
  MemoryPool pool;
  const int64_t rows = 20, cols = 50, n = rows * cols;
  const AdamWHyper h{1e-3f, 0.9f, 0.95f, 1e-8f, 0.0f};
  Tensor p = random_tensor(pool, {n}, 5), g = random_tensor(pool, {n}, 6);
  Tensor mq = make_tensor(pool, {quant4_bytes(n)}, DType::i8);
  Tensor vq = make_tensor(pool, {quant4_bytes(n)}, DType::i8);
  Tensor ma = make_tensor(pool, {quant4_blocks(n)}), vs = make_tensor(pool, {rows + cols});
  adamw4bit_update_rank1(p, g, rows, cols, mq, ma, vq, vs, h, 1, 1.0f);
  const float* r = vs.data<float>();
  const auto* codes = reinterpret_cast<const uint8_t*>(vq.data<int8_t>());
  const Quant4Map& u = unsigned_linear4_map();
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < cols; ++j) {
      const float gi = g.data<float>()[i * cols + j];
      const double v = (1.0 - 0.95) * double(gi) * gi;  // v after one step from zero
      const double s = std::min(r[i], r[rows + j]);
      const double back = u.values[code4_at(codes, i * cols + j)] * s;
      const double bound = v >= s / 16 ? s / 32 : s / 16;
      ASSERT_LE(std::fabs(back - v), bound * (1 + 1e-5)) << i << ", " << j;
      ASSERT_GT(back, 0.0);
    }
}

TEST(AdamW4bit, ShapesAreChecked) {
  MemoryPool pool;
  Tensor p = make_tensor(pool, {300}), g = make_tensor(pool, {300});
  Tensor q = make_tensor(pool, {150}, DType::i8), q2 = make_tensor(pool, {150}, DType::i8);
  Tensor a = make_tensor(pool, {3}), s = make_tensor(pool, {3});
  Tensor short_q = make_tensor(pool, {149}, DType::i8);
  EXPECT_TRUE(throws_with<ShapeError>(
      [&] { adamw4bit_update(p, g, short_q, a, q2, s, AdamWHyper{}, 1); },
      {"[adamw4bit]", "m_codes"}));
  Tensor rc = make_tensor(pool, {13});
  EXPECT_TRUE(throws_with<ShapeError>(
      [&] { adamw4bit_update_rank1(p, g, 7, 43, q, a, q2, rc, AdamWHyper{}, 1); },
      {"[adamw4bit_rank1]", "(7, 43)"}));
  EXPECT_TRUE(throws_with<ShapeError>(
      [&] { adamw4bit_update_rank1(p, g, 30, 10, q, a, q2, rc, AdamWHyper{}, 1); },
      {"[adamw4bit_rank1]", "v_rowcol"}));
}

}  // namespace
}  // namespace memfit::kernels
