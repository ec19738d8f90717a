// Block-wise 8-bit quantisation: the dynamic maps' shape, nearest-entry search against brute
// force, the SIMD path (whichever target the dispatch chose) against the scalar reference, and
// round-trip error bounds on normal and heavy-tailed data.
#include "memfit/kernels/cpu/blockwise_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "optimizer_reference.h"

namespace memfit::kernels {
namespace {

using memfit::testing::max_half_gap;

TEST(DynamicMap, SignedIsSortedSymmetricWithZeroAndOne) {
  const QuantMap& m = signed_dynamic_map();
  EXPECT_TRUE(m.is_signed);
  ASSERT_EQ(m.values.size(), 256u);
  for (int i = 0; i + 1 < 256; ++i) EXPECT_LT(m.values[i], m.values[i + 1]) << i;
  // bitsandbytes' construction: 127 magnitudes mirrored around 0, then 1.0 on top. -1 itself is
  // not an entry, so the map is symmetric except for its top entry.
  EXPECT_EQ(m.values[127], 0.0f);
  EXPECT_EQ(m.values[255], 1.0f);
  for (int k = 1; k <= 127; ++k) EXPECT_EQ(m.values[127 + k], -m.values[127 - k]) << k;
  EXPECT_FLOAT_EQ(m.values[0], -(1.0f - 0.9f / 128.0f));  // -0.99296875
  EXPECT_FLOAT_EQ(m.values[128], 0.55e-6f);               // decade 10^-6: one piece
  EXPECT_FLOAT_EQ(m.values[254], 1.0f - 0.9f / 128.0f);
}

TEST(DynamicMap, UnsignedIsSortedFromZeroToOne) {
  const QuantMap& m = unsigned_dynamic_map();
  EXPECT_FALSE(m.is_signed);
  for (int i = 0; i + 1 < 256; ++i) EXPECT_LT(m.values[i], m.values[i + 1]) << i;
  EXPECT_EQ(m.values[0], 0.0f);
  EXPECT_EQ(m.values[255], 1.0f);
  EXPECT_FLOAT_EQ(m.values[1], 0.325e-6f);  // decade 10^-6: two pieces
  EXPECT_FLOAT_EQ(m.values[254], 1.0f - 0.9f / 256.0f);
}

TEST(DynamicMap, WorstRoundingErrorIsStated) {
  // The bounds Note [8-bit optimizers] states, in units of the block's absmax.
  EXPECT_LT(max_half_gap(signed_dynamic_map()), 0.00704);
  EXPECT_LT(max_half_gap(unsigned_dynamic_map()), 0.00352);
}

TEST(DynamicMap, NearestIsTheClosestEntry) {
  for (const QuantMap* map : {&signed_dynamic_map(), &unsigned_dynamic_map()}) {
    std::vector<float> xs;
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> u(map->is_signed ? -1.05f : -0.05f, 1.05f);
    for (int i = 0; i < 20000; ++i) xs.push_back(u(rng));
    std::uniform_real_distribution<float> tiny(-1e-5f, 1e-5f);  // the finest decades
    for (int i = 0; i < 2000; ++i) xs.push_back(tiny(rng));
    for (float v : map->values) xs.push_back(v);
    for (float x : xs) {
      int q = map->nearest(x);
      double best = std::numeric_limits<double>::infinity();
      for (float v : map->values)
        best = std::min(best, std::fabs(static_cast<double>(x) - static_cast<double>(v)));
      // Thresholds are midpoints rounded to float: a near-tie may go either way by an ulp.
      EXPECT_LE(std::fabs(static_cast<double>(x) - map->values[q]),
                best + 1e-7 * std::fabs(x) + 1e-12)
          << "x = " << x << " -> " << q;
    }
    for (int i = 0; i < 256; ++i) EXPECT_EQ(map->nearest(map->values[i]), i);
  }
}

TEST(BlockQuant, FastPathMatchesReference) {
  for (const QuantMap* map : {&signed_dynamic_map(), &unsigned_dynamic_map()}) {
    for (int64_t n : {1, 7, 15, 16, 17, 100, 255, 256}) {
      std::vector<float> x = memfit::testing::normal_vector(n, 100 + static_cast<uint32_t>(n));
      if (!map->is_signed)
        for (float& v : x) v = v * v;
      std::vector<uint8_t> q_fast(n), q_ref(n);
      float a_fast = quantize_block(x.data(), n, *map, q_fast.data());
      float a_ref = quantize_block_reference(x.data(), n, *map, q_ref.data());
      EXPECT_EQ(a_fast, a_ref) << n;
      EXPECT_EQ(q_fast, q_ref) << "n = " << n << (map->is_signed ? " signed" : " unsigned");
    }
  }
}

TEST(BlockQuant, ZeroBlockKeepsAbsmaxZeroAndDecodesToZero) {
  std::vector<float> x(100, 0.0f), y(100, 1.0f);
  std::vector<uint8_t> q(100);
  for (const QuantMap* map : {&signed_dynamic_map(), &unsigned_dynamic_map()}) {
    EXPECT_EQ(quantize_block(x.data(), 100, *map, q.data()), 0.0f);
    for (uint8_t c : q) EXPECT_EQ(map->values[c], 0.0f);
    dequantize_block(q.data(), 100, 0.0f, *map, y.data());
    for (float v : y) EXPECT_EQ(v, 0.0f);
  }
}

// Quantises x (n values) and returns the worst |x - dequant| / absmax over all elements.
double worst_relative_to_absmax(const std::vector<float>& x, const QuantMap& map) {
  MemoryPool pool;
  const int64_t n = static_cast<int64_t>(x.size());
  Tensor xt = Tensor::empty(pool, {n}, DType::f32, Category::workspace, "x");
  Tensor q = Tensor::empty(pool, {n}, DType::i8, Category::workspace, "q");
  Tensor a = Tensor::empty(pool, {quant_blocks(n)}, DType::f32, Category::workspace, "a");
  Tensor y = Tensor::empty(pool, {n}, DType::f32, Category::workspace, "y");
  std::copy(x.begin(), x.end(), xt.data<float>());
  quantize_blockwise(xt, q, a, map);
  dequantize_blockwise(q, a, map, y);
  double worst = 0;
  for (int64_t b = 0; b < quant_blocks(n); ++b) {
    const int64_t begin = b * kQuantBlock, end = std::min(n, begin + kQuantBlock);
    float amax = 0;
    for (int64_t j = begin; j < end; ++j) amax = std::max(amax, std::fabs(x[j]));
    EXPECT_EQ(a.data<float>()[b], amax);
    if (amax == 0) continue;
    for (int64_t j = begin; j < end; ++j)
      worst = std::max(worst, std::fabs(static_cast<double>(x[j]) - y.data<float>()[j]) / amax);
  }
  return worst;
}

std::vector<float> heavy_tailed(int64_t n, uint32_t seed) {
  // Cauchy (Student-t with one degree of freedom): tan(pi (u - 1/2)).
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<float> x(n);
  for (auto& v : x) v = static_cast<float>(std::tan(M_PI * (u(rng) - 0.5)));
  return x;
}

TEST(BlockQuant, RoundTripErrorWithinHalfTheWidestGap) {
  // Stated bound: |x - dequant(quant(x))| <= 0.00704 absmax (signed), 0.00352 absmax
  // (unsigned, for the non-negative second moment), whatever the distribution, since every
  // normalised value lies in the map's range.
  const int64_t n = 256 * 300 + 77;  // a partial last block; threaded
  const double slack = 1e-6;         // float rounding of x / absmax and of the product back
  for (auto x : {memfit::testing::normal_vector(n, 1), heavy_tailed(n, 2)}) {
    double s = worst_relative_to_absmax(x, signed_dynamic_map());
    EXPECT_LE(s, max_half_gap(signed_dynamic_map()) + slack);
    for (float& v : x) v = v * v;
    double u = worst_relative_to_absmax(x, unsigned_dynamic_map());
    EXPECT_LE(u, max_half_gap(unsigned_dynamic_map()) + slack);
  }
}

TEST(BlockQuant, TensorArgumentsAreChecked) {
  MemoryPool pool;
  Tensor x = Tensor::empty(pool, {300}, DType::f32, Category::workspace, "x");
  Tensor q = Tensor::empty(pool, {300}, DType::i8, Category::workspace, "q");
  Tensor a1 = Tensor::empty(pool, {1}, DType::f32, Category::workspace, "a");
  Tensor a2 = Tensor::empty(pool, {2}, DType::f32, Category::workspace, "a");
  Tensor qf = Tensor::empty(pool, {300}, DType::f32, Category::workspace, "q");
  EXPECT_THROW(quantize_blockwise(x, q, a1, signed_dynamic_map()), ShapeError);
  EXPECT_THROW(quantize_blockwise(x, qf, a2, signed_dynamic_map()), DTypeError);
  EXPECT_NO_THROW(quantize_blockwise(x, q, a2, signed_dynamic_map()));
}

}  // namespace
}  // namespace memfit::kernels
