// Conversions: the scalar bf16 / f16 definitions at the rounding edge cases (ties to even,
// subnormals, overflow, inf, NaN) and against the F16C instruction, every half value round
// trip, the vectorised tensor conversion bit-identical to the scalar one, stochastic rounding
// unbiased and reproducible, the non-finite scan and the fused unscale-and-check.
#include "memfit/kernels/cpu/convert.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>

#include "memfit/kernels/cpu/residual.h"
#include "mixed_test_util.h"

#if defined(__x86_64__)
#include <immintrin.h>

#include "memfit/core/cpu.h"
#endif

namespace memfit::kernels {
namespace {

using namespace test;

float from_bits(uint32_t u) { return std::bit_cast<float>(u); }

TEST(Bf16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(bf16_from_f32(1.0f), 0x3f80);
  EXPECT_EQ(bf16_from_f32(1.0f + 0x1p-8f), 0x3f80);             // tie, down to even
  EXPECT_EQ(bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82);         // tie, up to even
  EXPECT_EQ(bf16_from_f32(1.0f + 0x1p-8f + 0x1p-20f), 0x3f81);  // just above the tie
  EXPECT_EQ(bf16_from_f32(-1.0f - 0x1p-8f), 0xbf80);
  // Subnormals round like everything else (vcvtneps2bf16 would flush them to zero).
  EXPECT_EQ(bf16_from_f32(from_bits(0x00008000)), 0x0000);  // tie to even 0
  EXPECT_EQ(bf16_from_f32(from_bits(0x00018000)), 0x0002);  // tie to even 2
  EXPECT_EQ(bf16_from_f32(from_bits(0x007fffff)), 0x0080);  // up into the normals
  EXPECT_EQ(bf16_from_f32(from_bits(0x7f7fffff)), 0x7f80);  // max float rounds to inf
  EXPECT_EQ(bf16_from_f32(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(bf16_from_f32(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(bf16_from_f32(from_bits(0x7fa00001)), 0x7fe0);  // signalling NaN comes back quiet
  EXPECT_EQ(bf16_from_f32(-0.0f), 0x8000);
}

TEST(F16, RoundsToNearestTiesToEven) {
  EXPECT_EQ(f16_from_f32(1.0f), 0x3c00);
  EXPECT_EQ(f16_from_f32(1.0f + 0x1p-11f), 0x3c00);      // tie, down to even
  EXPECT_EQ(f16_from_f32(1.0f + 3 * 0x1p-11f), 0x3c02);  // tie, up to even
  EXPECT_EQ(f16_from_f32(65504.0f), 0x7bff);             // largest finite
  EXPECT_EQ(f16_from_f32(65519.99f), 0x7bff);
  EXPECT_EQ(f16_from_f32(65520.0f), 0x7c00);  // the midpoint overflows to inf
  EXPECT_EQ(f16_from_f32(1e5f), 0x7c00);
  EXPECT_EQ(f16_from_f32(-1e30f), 0xfc00);
  EXPECT_EQ(f16_from_f32(std::numeric_limits<float>::infinity()), 0x7c00);
  // Subnormals: units of 2^-24, ties to even, the carry into the smallest normal.
  EXPECT_EQ(f16_from_f32(0x1p-24f), 0x0001);
  EXPECT_EQ(f16_from_f32(0x1p-25f), 0x0000);
  EXPECT_EQ(f16_from_f32(1.5f * 0x1p-25f), 0x0001);
  EXPECT_EQ(f16_from_f32(3 * 0x1p-25f), 0x0002);
  EXPECT_EQ(f16_from_f32(0x1p-14f - 0x1p-25f), 0x0400);
  EXPECT_EQ(f16_from_f32(0x1p-14f), 0x0400);
  EXPECT_EQ(f16_from_f32(-0x1p-30f), 0x8000);
  EXPECT_EQ(f16_from_f32(from_bits(0x7fa00001)), 0x7f00);  // quiet, top payload bits kept
  EXPECT_TRUE(std::isnan(f32_from_f16(0x7c01)));
  EXPECT_EQ(f32_from_f16(0x0001), 0x1p-24f);
  EXPECT_EQ(f32_from_f16(0xfbff), -65504.0f);
  EXPECT_EQ(f32_from_f16(0x7c00), std::numeric_limits<float>::infinity());
}

// Every bf16 and f16 value survives the trip through f32 (NaNs stay NaN, maybe quietened).
TEST(HalfTypes, EveryValueRoundTrips) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const auto b = static_cast<uint16_t>(h);
    const float fb = f32_from_bf16(b), fh = f32_from_f16(b);
    if (std::isnan(fb)) {
      EXPECT_TRUE(std::isnan(f32_from_bf16(bf16_from_f32(fb))));
    } else {
      ASSERT_EQ(bf16_from_f32(fb), b) << std::hex << h;
    }
    if (std::isnan(fh)) {
      EXPECT_TRUE(std::isnan(f32_from_f16(f16_from_f32(fh))));
    } else {
      ASSERT_EQ(f16_from_f32(fh), b) << std::hex << h;
    }
  }
}

#if defined(__x86_64__)
// F16C's conversions, compiled by attribute (the build is portable) and run where the CPU has
// them (every AVX2 machine memfit supports).
__attribute__((target("f16c"))) uint16_t f16c_from_f32(float x) {
  return static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT));
}
__attribute__((target("f16c"))) float f16c_to_f32(uint16_t h) { return _cvtsh_ss(h); }

// The scalar f16 definition against the hardware's, over a sample of every exponent.
TEST(F16, ScalarMatchesF16CInstruction) {
  if (!cpu::has(cpu::Isa::avx2)) GTEST_SKIP() << "no F16C (or MEMFIT_MAX_ISA=scalar)";
  for (uint64_t u = 0; u <= 0xffffffffull; u += 65521) {  // a prime stride: all low bits vary
    const float x = from_bits(static_cast<uint32_t>(u));
    const auto hw = f16c_from_f32(x);
    ASSERT_EQ(f16_from_f32(x), hw) << std::hex << u;
  }
  for (uint32_t h = 0; h < 65536; ++h) {
    const float hw = f16c_to_f32(static_cast<uint16_t>(h));
    ASSERT_EQ(std::bit_cast<uint32_t>(f32_from_f16(static_cast<uint16_t>(h))),
              std::bit_cast<uint32_t>(hw))
        << std::hex << h;
  }
}
#endif

// Bit patterns that cover ties, subnormals, overflow and NaN in both half types, then the
// tensor conversion (vector path where built) must equal the scalar one bit for bit.
std::vector<uint32_t> edge_patterns(size_t n) {
  std::vector<uint32_t> v = {0x00000000, 0x80000000, 0x00008000, 0x00018000, 0x007fffff,
                             0x3f808000, 0x3f818000, 0x477fefff, 0x477ff000, 0x7f7fffff,
                             0x7f800000, 0xff800000, 0x7fa00001, 0xffc00001, 0x33000000,
                             0x33400000, 0x387fc000, 0x38800000};
  uint32_t x = 12345;
  while (v.size() < n) {
    x = x * 1664525u + 1013904223u;
    v.push_back(x);
  }
  return v;
}

TEST(Convert, TensorMatchesScalarBitForBit) {
  MemoryPool pool;
  for (int64_t n : {1, 17, 100003}) {
    const std::vector<uint32_t> bits = edge_patterns(static_cast<size_t>(n));
    Tensor src = make_tensor(pool, {n});
    std::memcpy(src.raw_data(), bits.data(), 4 * static_cast<size_t>(n));
    for (DType t : {DType::bf16, DType::f16}) {
      SCOPED_TRACE(fmt::format("n={} {}", n, dtype_name(t)));
      Tensor half = make_tensor(pool, {n}, t), back = make_tensor(pool, {n});
      convert(half, src);
      convert(back, half);
      const auto* h = static_cast<const uint16_t*>(half.raw_data());
      const auto* b = static_cast<const uint32_t*>(back.raw_data());
      for (int64_t i = 0; i < n; ++i) {
        const float x = from_bits(bits[i]);
        const uint16_t want = t == DType::bf16 ? bf16_from_f32(x) : f16_from_f32(x);
        ASSERT_EQ(h[i], want) << std::hex << bits[i];
        const float wb = t == DType::bf16 ? f32_from_bf16(want) : f32_from_f16(want);
        ASSERT_EQ(b[i], std::bit_cast<uint32_t>(wb)) << std::hex << bits[i];
      }
    }
  }
  // bf16 <-> f16 directly, and a same-type copy.
  Tensor a = make_tensor(pool, {5, 7}, DType::bf16), c = make_tensor(pool, {35}, DType::f16);
  std::vector<double> v;
  Tensor f = random_any(pool, {5, 7}, DType::f32, 3, &v, -100, 100);
  convert(a, f);
  convert(c, a);
  EXPECT_EQ(to_doubles_any(c), rounded(DType::f16, rounded(DType::bf16, v)));
  Tensor copy = make_tensor(pool, {35}, DType::bf16);
  static_cast<uint16_t*>(a.raw_data())[3] = 0x7f81;  // a signalling NaN is copied as it is
  convert(copy, a);
  EXPECT_EQ(std::memcmp(copy.raw_data(), a.raw_data(), a.nbytes()), 0);
}

TEST(Convert, Errors) {
  MemoryPool pool;
  Tensor f = make_tensor(pool, {8}), b = make_tensor(pool, {9}, DType::bf16);
  EXPECT_TRUE(throws_with<ShapeError>([&] { convert(b, f); }, {"[convert]", "(9,)", "(8,)"}));
  Tensor ids = make_tensor(pool, {8}, DType::i32);
  EXPECT_TRUE(throws_with<DTypeError>([&] { convert(f, ids); }, {"[convert]", "src", "i32"}));
  Tensor h = make_tensor(pool, {8}, DType::f16);
  EXPECT_TRUE(throws_with<DTypeError>([&] { convert_stochastic(h, f, 1); },
                                      {"[convert_stochastic]", "dst", "bf16", "f16"}));
}

// The mean of many stochastically rounded copies of x approaches x: each draw is one of the
// two neighbours, so its standard deviation is at most half their gap; with n draws the mean
// is within 5 gap / (2 sqrt(n)) of x except with negligible probability.
TEST(StochasticRounding, IsUnbiased) {
  MemoryPool pool;
  const int64_t n = 1 << 20;
  for (float x : {1.0f + 0.3f * 0x1p-7f, -3.0f - 0.77f * 0x1p-6f, 1e-3f, 0x1.23456p-130f}) {
    SCOPED_TRACE(x);
    Tensor src = make_tensor(pool, {n}), dst = make_tensor(pool, {n}, DType::bf16);
    std::fill_n(src.data<float>(), n, x);
    convert_stochastic(dst, src, 42);
    const std::vector<double> got = to_doubles_any(dst);
    const double lo = f32_from_bf16(static_cast<uint16_t>(std::bit_cast<uint32_t>(x) >> 16));
    double sum = 0.0, gap = 0.0;
    for (double g : got) {
      sum += g;
      gap = std::max(gap, std::abs(g - lo));
    }
    ASSERT_GT(gap, 0.0);  // both neighbours occur
    EXPECT_NEAR(sum / n, x, 5.0 * gap / (2.0 * std::sqrt(double(n))));
  }
  // Values a bf16 holds exactly never move.
  Tensor src = make_tensor(pool, {1000}), dst = make_tensor(pool, {1000}, DType::bf16);
  std::vector<double> v;
  Tensor exact = random_any(pool, {1000}, DType::bf16, 9, &v);
  copy_in(src, v);
  convert_stochastic(dst, src, 7);
  EXPECT_EQ(to_doubles_any(dst), v);
}

TEST(StochasticRounding, IsDeterministicBySeedAndIndex) {
  MemoryPool pool;
  const int64_t n = 50001;
  std::vector<double> v;
  Tensor src = random_any(pool, {n}, DType::f32, 5, &v);
  Tensor a = make_tensor(pool, {n}, DType::bf16), b = make_tensor(pool, {n}, DType::bf16);
  Tensor c = make_tensor(pool, {n}, DType::bf16);
  convert_stochastic(a, src, 1234);
  convert_stochastic(b, src, 1234);
  convert_stochastic(c, src, 1235);
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()), 0);
  EXPECT_NE(std::memcmp(a.raw_data(), c.raw_data(), a.nbytes()), 0);
  // Converting in two pieces with their offsets gives the same bits as converting at once.
  const int64_t cut = 12345;
  Tensor lo = src.view(0, {cut}), hi = src.view(cut, {n - cut});
  Tensor dlo = c.view(0, {cut}), dhi = c.view(cut, {n - cut});
  convert_stochastic(dlo, lo, 1234, 0);
  convert_stochastic(dhi, hi, 1234, cut);
  EXPECT_EQ(std::memcmp(a.raw_data(), c.raw_data(), a.nbytes()), 0);
  // Indices across 2^32 (the vector path hands such a group to the scalar one) follow the
  // scalar definition.
  const uint64_t base = (uint64_t{1} << 32) - 21;
  Tensor d = make_tensor(pool, {n}, DType::bf16);
  convert_stochastic(d, src, 99, base);
  const auto* got = static_cast<const uint16_t*>(d.raw_data());
  for (int64_t i = 0; i < 64; ++i) {
    const uint64_t idx = base + static_cast<uint64_t>(i);
    const uint32_t r =
        sr_bits(sr_key(99, static_cast<uint32_t>(idx >> 32)), static_cast<uint32_t>(idx));
    ASSERT_EQ(got[i], bf16_from_f32_stochastic(static_cast<float>(v[i]), r)) << i;
  }
}

TEST(AllFinite, FindsInfAndNaNAnywhere) {
  MemoryPool pool;
  for (DType t : {DType::f32, DType::bf16, DType::f16}) {
    for (int64_t n : {1, 31, 33, 50001}) {
      SCOPED_TRACE(fmt::format("{} n={}", dtype_name(t), n));
      std::vector<double> v = random_values(static_cast<size_t>(n), 3, -60000, 60000);
      Tensor x = make_tensor(pool, {n}, t);
      copy_in_any(x, v);
      EXPECT_TRUE(all_finite(x));
      // One element at a time made non-finite through a one-element view, then restored.
      for (int64_t at : {int64_t{0}, n / 2, n - 1}) {
        Tensor one = x.view(at, {1});
        for (double bad : {INFINITY, -INFINITY, NAN}) {
          copy_in_any(one, {bad});
          EXPECT_FALSE(all_finite(x)) << at << " " << bad;
        }
        copy_in_any(one, {v[at]});
      }
      EXPECT_TRUE(all_finite(x));
    }
  }
  // f16 overflow is a non-finite value: 1e5 rounds to inf.
  Tensor h = make_tensor(pool, {4}, DType::f16), f = make_tensor(pool, {4});
  copy_in(f, std::vector<double>{1, 2, 1e5, 4});
  convert(h, f);
  EXPECT_FALSE(all_finite(h));
}

TEST(UnscaleAndCheck, ScalesAndMatchesSumSquares) {
  MemoryPool pool;
  const int64_t n = 100003;
  std::vector<double> v;
  Tensor g = random_any(pool, {n}, DType::f32, 8, &v, -1000, 1000);
  const UnscaleResult r = unscale_and_check(g, 1.0f / 1024.0f);
  EXPECT_TRUE(r.finite);
  const std::vector<double> got = to_doubles(g);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], static_cast<float>(v[i] / 1024.0)) << i;
  EXPECT_EQ(r.sum_squares, sum_squares(g));
  for (double bad : {INFINITY, NAN}) {
    v[n - 3] = bad;
    copy_in(g, v);
    EXPECT_FALSE(unscale_and_check(g, 0.5f).finite);
  }
}

}  // namespace
}  // namespace memfit::kernels
