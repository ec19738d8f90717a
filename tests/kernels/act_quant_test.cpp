// Activation compression (kernels/cpu/act_quant.h): the FP8 E4M3 codec against brute force, the
// vector kernels (whichever target the dispatch chose; CTest runs this file again under
// MEMFIT_MAX_ISA=avx2 and =scalar) bit for bit against kernels/ref/act_quant_ref.h in every
// storage type and both formats, and the stated round-trip bound of each format on random,
// heavy-tailed, tiny and all-zero blocks.
#include "memfit/kernels/cpu/act_quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <random>
#include <vector>

#include "memfit/kernels/ref/act_quant_ref.h"
#include "mixed_test_util.h"

namespace memfit::kernels {
namespace {

using test::copy_in_any;
using test::make_tensor;
using test::to_doubles_any;

DType codes_type(bool fp8) { return fp8 ? DType::u8 : DType::i8; }

// The 254 finite E4M3 values with their codes (both zeros included).
std::vector<std::pair<float, uint8_t>> fp8_table() {
  std::vector<std::pair<float, uint8_t>> t;
  for (int c = 0; c < 256; ++c)
    if ((c & 0x7f) != 0x7f) t.emplace_back(f32_from_fp8_e4m3(static_cast<uint8_t>(c)), c);
  return t;
}

TEST(Fp8E4M3, CodesDecodeToTheFormatsValues) {
  EXPECT_EQ(f32_from_fp8_e4m3(0x7e), 448.0f);          // S.1111.110: the largest
  EXPECT_EQ(f32_from_fp8_e4m3(0x08), 0x1p-6f);          // the smallest normal
  EXPECT_EQ(f32_from_fp8_e4m3(0x01), 0x1p-9f);          // the smallest subnormal
  EXPECT_EQ(f32_from_fp8_e4m3(0x07), 7 * 0x1p-9f);      // the largest subnormal
  EXPECT_EQ(f32_from_fp8_e4m3(0x38), 1.0f);             // exponent 7 = bias
  EXPECT_EQ(f32_from_fp8_e4m3(0xb8), -1.0f);
  EXPECT_EQ(f32_from_fp8_e4m3(0x3c), 1.5f);
  for (auto [v, c] : fp8_table()) {
    EXPECT_EQ(fp8_e4m3_from_f32(v), c) << "value " << v;
    EXPECT_EQ(std::signbit(v), (c & 0x80) != 0);
  }
}

TEST(Fp8E4M3, EncodingIsTheNearestValueTiesToEven) {
  const auto table = fp8_table();
  std::mt19937 rng(3);
  std::vector<float> ys;
  std::uniform_real_distribution<float> wide(-448.0f, 448.0f), narrow(-0.05f, 0.05f);
  for (int i = 0; i < 20000; ++i) ys.push_back(wide(rng));
  for (int i = 0; i < 5000; ++i) ys.push_back(narrow(rng));  // subnormals and the first binades
  // Every midpoint between neighbours: a tie, which goes to the even code.
  for (size_t i = 0; i + 1 < table.size(); ++i)
    if (table[i].second < 0x7e) {
      const uint8_t c = table[i].second;
      ys.push_back((f32_from_fp8_e4m3(c) + f32_from_fp8_e4m3(c + 1)) / 2);
    }
  for (float y : ys) {
    const uint8_t got = fp8_e4m3_from_f32(y);
    const double err = std::fabs(double(f32_from_fp8_e4m3(got)) - y);
    double best = std::numeric_limits<double>::infinity();
    for (auto [v, c] : table) best = std::min(best, std::fabs(double(v) - y));
    ASSERT_EQ(err, best) << "y = " << y << " -> code " << int(got);
    if (y != 0.0f) {
      EXPECT_EQ(std::signbit(y), (got & 0x80) != 0) << y;
    }
    // A tie goes to the even mantissa (the code's last bit).
    const uint8_t other = got ^ 1;
    if ((other & 0x7f) != 0x7f &&
        std::fabs(double(f32_from_fp8_e4m3(other)) - y) == best && (got & 0x7f) != 0) {
      EXPECT_EQ(got & 1, 0) << "tie at " << y;
    }
  }
}

struct Quantized {
  std::vector<uint8_t> codes;
  std::vector<float> scales;
  std::vector<double> restored;  // dequantised into the input's type
};

// Runs the kernels on `values` (rounded to `dtype` first): quantise, then dequantise into a
// tensor of `dtype`.
Quantized run_fast(const std::vector<double>& values, DType dtype, bool fp8) {
  MemoryPool pool;
  const int64_t n = static_cast<int64_t>(values.size());
  Tensor x = make_tensor(pool, {n}, dtype);
  copy_in_any(x, values);
  Tensor codes = make_tensor(pool, {n}, codes_type(fp8));
  Tensor scales = make_tensor(pool, {act_blocks(n)});
  act_quantize(x, codes, scales);
  Tensor y = make_tensor(pool, {n}, dtype);
  act_dequantize(codes, scales, y);
  Quantized q;
  const auto* c = static_cast<const uint8_t*>(codes.raw_data());
  q.codes.assign(c, c + n);
  q.scales.assign(scales.data<float>(), scales.data<float>() + scales.numel());
  q.restored = to_doubles_any(y);
  return q;
}

// The reference on the same values (rounded to `dtype`), its f32 output rounded to `dtype`.
Quantized run_ref(const std::vector<double>& values, DType dtype, bool fp8) {
  const int64_t n = static_cast<int64_t>(values.size());
  std::vector<float> x(values.size()), y(values.size());
  for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(test::round_to(dtype, values[i]));
  Quantized q;
  q.codes.resize(x.size());
  q.scales.resize(static_cast<size_t>(act_blocks(n)));
  ref::act_quantize_ref(x.data(), n, fp8, q.codes.data(), q.scales.data());
  ref::act_dequantize_ref(q.codes.data(), q.scales.data(), n, fp8, y.data());
  for (float v : y) q.restored.push_back(test::round_to(dtype, v));
  return q;
}

bool same_floats(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Normal values with every 37th a large outlier and one block of tiny values: blocks whose
// absmax is set by one value.
std::vector<double> heavy_tailed(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::student_t_distribution<double> t(1.5);
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = t(rng) * (i % 37 == 5 ? 300.0 : 1.0);
  for (size_t i = 64; i < std::min<size_t>(n, 128); ++i) v[i] *= 1e-30;
  return v;
}

TEST(ActQuant, FastPathMatchesReferenceBitForBit) {
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (bool fp8 : {false, true})
      // Partial last blocks and partial vectors; 20000 values run on several threads.
      for (int64_t n : {1, 7, 15, 16, 17, 63, 64, 65, 129, 1000, 20011}) {
        SCOPED_TRACE(fmt::format("{} {} n={}", dtype_name(dtype), fp8 ? "fp8" : "int8", n));
        std::vector<double> v = test::random_values(n, 11 + static_cast<uint32_t>(n), -3, 3);
        if (n > 100) v = heavy_tailed(static_cast<size_t>(n), 5);
        if (dtype == DType::f16)  // within f16's range
          for (double& x : v) x = std::clamp(x, -6e4, 6e4);
        const Quantized fast = run_fast(v, dtype, fp8), want = run_ref(v, dtype, fp8);
        EXPECT_EQ(fast.codes, want.codes);
        EXPECT_TRUE(same_floats(fast.scales, want.scales));
        EXPECT_EQ(fast.restored, want.restored);
      }
}

// The bound act_quant.h states for one value, A the block's absmax (floored at 2^-100).
double stated_bound(bool fp8, double x, double A) {
  A = std::max(A, double(kActMinAbsmax));
  const double slack = 0x1p-20 * A;
  return fp8 ? 0x1p-4 * std::fabs(x) + 0x1p-10 * A / 448 + slack : A / 254 + slack;
}

// The worst |x - x'| / bound over all values (<= 1 when the bound holds), in f32.
double worst_against_bound(const std::vector<double>& v, bool fp8) {
  const Quantized q = run_fast(v, DType::f32, fp8);
  double worst = 0;
  for (size_t b = 0; b * kActBlock < v.size(); ++b) {
    const size_t begin = b * kActBlock, end = std::min(v.size(), begin + kActBlock);
    double A = 0;
    for (size_t i = begin; i < end; ++i) A = std::max(A, std::fabs(double(float(v[i]))));
    if (A == 0) continue;
    for (size_t i = begin; i < end; ++i) {
      const double x = float(v[i]);
      worst = std::max(worst, std::fabs(x - q.restored[i]) / stated_bound(fp8, x, A));
    }
  }
  return worst;
}

TEST(ActQuant, RoundTripErrorIsWithinTheStatedBound) {
  std::vector<double> normal(64 * 200 + 9);
  std::mt19937 rng(1);
  std::normal_distribution<double> g(0, 2);
  for (double& x : normal) x = g(rng);
  const std::vector<double> tails = heavy_tailed(64 * 200 + 9, 2);
  // Tiny blocks, below the 2^-100 floor and around it.
  std::vector<double> tiny(256);
  for (size_t i = 0; i < tiny.size(); ++i) tiny[i] = normal[i] * (i < 128 ? 1e-33 : 1e-38);
  for (bool fp8 : {false, true}) {
    SCOPED_TRACE(fp8 ? "fp8" : "int8");
    for (const std::vector<double>* v :
         std::initializer_list<const std::vector<double>*>{&normal, &tails, &tiny}) {
      const double worst = worst_against_bound(*v, fp8);
      EXPECT_LE(worst, 1.0);
      // Not vacuous: the worst value comes near the bound (int8's is A / 254, reached by a
      // value half-way between codes; fp8's relative 2^-4 by one half-way between values).
      if (v != &tiny) {
        EXPECT_GT(worst, 0.5);
      }
    }
  }
}

TEST(ActQuant, HalfOutputsAddHalfAnUlpOfTheirType) {
  const std::vector<double> v = heavy_tailed(64 * 50, 9);
  for (DType dtype : {DType::bf16, DType::f16})
    for (bool fp8 : {false, true}) {
      const Quantized q = run_fast(v, dtype, fp8);
      for (size_t i = 0; i < v.size(); ++i) {
        const double x = test::round_to(dtype, v[i]);
        double A = 0;
        const size_t begin = i / kActBlock * kActBlock;
        for (size_t j = begin; j < std::min(v.size(), begin + kActBlock); ++j)
          A = std::max(A, std::fabs(test::round_to(dtype, v[j])));
        const double half_ulp = test::unit_roundoff(dtype) * std::fabs(q.restored[i]);
        // f16's subnormals: an absolute half step of 2^-25.
        const double floor = dtype == DType::f16 ? 0x1p-25 : 0.0;
        ASSERT_LE(std::fabs(x - q.restored[i]), stated_bound(fp8, x, A) + half_ulp + floor)
            << dtype_name(dtype) << (fp8 ? " fp8" : " int8") << " at " << i;
      }
    }
}

TEST(ActQuant, AllZeroBlocksHaveScaleZeroAndComeBackZero) {
  std::vector<double> v(64 * 3 + 5, 0.0);
  for (int i = 64; i < 128; ++i) v[i] = (i % 3) - 1.0;  // one block with values
  for (DType dtype : {DType::f32, DType::bf16, DType::f16})
    for (bool fp8 : {false, true}) {
      const Quantized q = run_fast(v, dtype, fp8);
      EXPECT_EQ(q.scales, (std::vector<float>{0.0f, 1.0f / (fp8 ? kFp8Max : kInt8Max), 0.0f, 0.0f}));
      for (size_t i = 0; i < v.size(); ++i) {
        if (i >= 64 && i < 128) continue;
        EXPECT_EQ(q.codes[i], 0) << i;
        EXPECT_EQ(q.restored[i], 0.0) << i;
      }
      for (int i = 64; i < 128; ++i) EXPECT_EQ(q.restored[i], v[i]) << "-1, 0, 1 are exact";
    }
}

TEST(ActQuant, ANonFiniteValueMakesItsBlockNaNAndNoOther) {
  std::vector<double> v = test::random_values(64 * 3, 4);
  v[70] = std::numeric_limits<double>::infinity();
  v[150] = std::numeric_limits<double>::quiet_NaN();
  for (bool fp8 : {false, true}) {
    const Quantized q = run_fast(v, DType::f32, fp8);
    EXPECT_FALSE(std::isnan(q.scales[0]));
    EXPECT_TRUE(std::isnan(q.scales[1]));
    EXPECT_TRUE(std::isnan(q.scales[2]));
    for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(std::isnan(q.restored[i]), i >= 64) << i;
  }
}

TEST(ActQuant, BadArgumentsAreTypedErrors) {
  MemoryPool pool;
  Tensor x = make_tensor(pool, {100});
  Tensor codes = make_tensor(pool, {100}, DType::i8), scales = make_tensor(pool, {2});
  Tensor wide_codes = make_tensor(pool, {100}), few_scales = make_tensor(pool, {1});
  Tensor ids = make_tensor(pool, {100}, DType::i32);
  EXPECT_THROW(act_quantize(x, wide_codes, scales), DTypeError);
  EXPECT_THROW(act_quantize(x, codes, few_scales), ShapeError);
  EXPECT_THROW(act_dequantize(codes, scales, ids), DTypeError);
  Tensor short_codes = make_tensor(pool, {99}, DType::u8);
  EXPECT_THROW(act_dequantize(short_codes, scales, x), ShapeError);
}

}  // namespace
}  // namespace memfit::kernels
