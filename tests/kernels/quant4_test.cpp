// 4-bit quantisation: the two maps' values (the paper's constructions), known vectors through
// quantise and dequantise, the packing order, and the SIMD path (whichever target the dispatch
// chose) against the scalar reference, code for code, over odd block lengths.
#include "memfit/kernels/cpu/quant4.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/kernels/ref/adamw4bit_ref.h"

namespace memfit::kernels {
namespace {

TEST(Quant4Map, SignedDynamicExponentValues) {
  const Quant4Map& m = signed_de4_map();
  // create_dynamic_map(signed, 3 exponent bits, 4 bits): per decade 10^-2, 10^-1, 10^0 the
  // midpoints of 1, 2 and 4 equal splits of [0.1, 1], mirrored, plus 0 and 1.
  const double mags[7] = {0.0055, 0.0325, 0.0775, 0.2125, 0.4375, 0.6625, 0.8875};
  for (int k = 0; k < 7; ++k) {
    EXPECT_NEAR(m.values[8 + k], mags[k], 1.2e-7 * mags[k]) << k;  // a float ulp
    EXPECT_EQ(m.values[6 - k], -m.values[8 + k]) << k;
  }
  EXPECT_EQ(m.values[7], 0.0f);
  EXPECT_EQ(m.values[15], 1.0f);
  for (int i = 0; i + 1 < kQuant4Codes; ++i) EXPECT_LT(m.values[i], m.values[i + 1]);
  // The float32 values of the reference construction, not the double one rounded.
  EXPECT_EQ(m.values[11], 0.21249999105930328f);
  EXPECT_EQ(m.values[9], 0.0325000025331974f);
}

TEST(Quant4Map, UnsignedLinearHasNoZero) {
  const Quant4Map& m = unsigned_linear4_map();
  for (int k = 0; k < kQuant4Codes; ++k) EXPECT_EQ(m.values[k], (k + 1) / 16.0f) << k;
  EXPECT_EQ(m.thresholds[0], 3.0f / 32.0f);
  EXPECT_EQ(m.thresholds[15], std::numeric_limits<float>::infinity());
  // Zero, and anything under the first threshold, decodes to 1/16 of the scale, never 0.
  EXPECT_EQ(m.nearest(0.0f), 0);
  EXPECT_EQ(m.nearest(3.0f / 32.0f), 0);  // on a threshold: the lower entry
  EXPECT_EQ(m.nearest(std::nextafter(3.0f / 32.0f, 1.0f)), 1);
  EXPECT_EQ(m.nearest(1.0f), 15);
  EXPECT_EQ(m.nearest(std::nanf("")), 0);
}

TEST(Quant4, KnownVectorRoundTrips) {
  const Quant4Map& m = signed_de4_map();
  // absmax 2: x / 2 = -0.45 -> -0.4375, 0.1 -> 0.0775 (nearer than 0.2125), 0.0015 -> 0
  // (nearer than 0.0055), 1 -> 1, 0.6 -> 0.6625 (nearer than 0.4375), -0.02 -> -0.0325.
  const float x[6] = {-0.9f, 0.2f, 0.003f, 2.0f, 1.2f, -0.04f};
  uint8_t packed[3] = {};
  EXPECT_EQ(quantize_block4(x, 6, m, packed), 2.0f);
  const uint8_t want[6] = {2, 10, 7, 15, 13, 5};
  for (int i = 0; i < 6; ++i) EXPECT_EQ(code4_at(packed, i), want[i]) << i;
  EXPECT_EQ(packed[0], 2 | (10 << 4));  // element 0 in the low nibble
  float back[6];
  dequantize_block4(packed, 6, 2.0f, m, back);
  const float decoded[6] = {-0.875f, 0.155f, 0.0f, 2.0f, 1.325f, -0.065f};
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(back[i], decoded[i], 1e-6) << i;
}

TEST(Quant4, ScaledCodesDivideByEachScale) {
  const Quant4Map& u = unsigned_linear4_map();
  const float x[5] = {0.5f, 0.5f, 0.0f, 3.0f, 7.0f};
  const float s[5] = {1.0f, 2.0f, 4.0f, 0.0f, 7.0f};
  uint8_t packed[3] = {0xff, 0xff, 0xff};
  quantize_scaled4(x, s, 5, u, packed);
  // 0.5 -> 8/16 (code 7); 0.25 -> code 3; 0 -> code 0 (1/16); a zero scale -> code 0; 1 -> 15.
  const uint8_t want[5] = {7, 3, 0, 0, 15};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(code4_at(packed, i), want[i]) << i;
  EXPECT_EQ(packed[2] >> 4, 0) << "the unused high nibble of an odd count";
  float back[5];
  dequantize_scaled4(packed, s, 5, u, back);
  EXPECT_EQ(back[0], 0.5f);
  EXPECT_EQ(back[3], 0.0f);  // 1/16 of a zero scale
  EXPECT_EQ(back[4], 7.0f);
}

class Quant4Fast : public ::testing::TestWithParam<int> {};

TEST_P(Quant4Fast, MatchesTheScalarReferenceCodeForCode) {
  const int n = GetParam();
  std::mt19937 gen(static_cast<uint32_t>(n));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n), s(n);
  for (int i = 0; i < n; ++i) {
    x[i] = normal(gen) * (i % 7 == 0 ? 10.0f : 1.0f);
    s[i] = i % 11 == 3 ? 0.0f : std::fabs(normal(gen)) + std::fabs(x[i]);
  }
  for (const Quant4Map* m : {&signed_de4_map(), &unsigned_linear4_map()}) {
    std::vector<uint8_t> fast(quant4_bytes(n), 0xaa), ref(quant4_bytes(n), 0x55);
    EXPECT_EQ(quantize_block4(x.data(), n, *m, fast.data()),
              ref::quantize_block4_ref(x.data(), n, *m, ref.data()));
    EXPECT_EQ(fast, ref);
    std::vector<float> ax(n);
    for (int i = 0; i < n; ++i) ax[i] = std::fabs(x[i]);
    quantize_scaled4(ax.data(), s.data(), n, *m, fast.data());
    ref::quantize_scaled4_ref(ax.data(), s.data(), n, *m, ref.data());
    EXPECT_EQ(fast, ref);
  }
}

INSTANTIATE_TEST_SUITE_P(Lengths, Quant4Fast, ::testing::Values(1, 2, 7, 16, 33, 127, 128));

TEST(Quant4, BlockLengthIsChecked) {
  std::vector<float> x(129, 1.0f);
  std::vector<uint8_t> q(65);
  EXPECT_THROW(quantize_block4(x.data(), 129, signed_de4_map(), q.data()), Error);
  EXPECT_THROW(quantize_block4(x.data(), 0, signed_de4_map(), q.data()), Error);
}

}  // namespace
}  // namespace memfit::kernels
