// FP8 casts (kernels/cpu/fp8.h): hand-checked codes of both formats (saturation, subnormals,
// ties, NaN, inf), every one of the 256 codes decoded as the spec's formula says and round-tripped,
// the scalar encoder against the brute-force reference (kernels/ref/fp8_ref.h) on random bit
// patterns, and the vector kernels bit for bit against the reference in f32 and bf16 (whichever
// target the dispatch chose; CTest runs this file again under MEMFIT_MAX_ISA=avx2 and =scalar).
// PyTorch 1.13 (the project's reference) has no float8 dtypes, so the values here come from the
// OCP FP8 spec (the table of fp8_value_ref) rather than from a torch fixture.
#include "memfit/kernels/cpu/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/kernels/ref/fp8_ref.h"
#include "mixed_test_util.h"

namespace memfit::kernels {
namespace {

using test::make_tensor;
constexpr Fp8Format kE4 = Fp8Format::e4m3, kE5 = Fp8Format::e5m2;
const float kInf = std::numeric_limits<float>::infinity();
const float kNaN = std::numeric_limits<float>::quiet_NaN();

TEST(Fp8, E4M3HandCheckedCodes) {
  EXPECT_EQ(fp8_encode(kE4, 1.0f), 0x38);          // 0.0111.000: exponent 7 = bias
  EXPECT_EQ(fp8_encode(kE4, -1.0f), 0xb8);
  EXPECT_EQ(fp8_encode(kE4, 240.0f), 0x77);        // 1.875 x 2^7 = 0.1110.111
  EXPECT_EQ(fp8_encode(kE4, 448.0f), 0x7e);        // the largest finite, 0.1111.110
  EXPECT_EQ(fp8_encode(kE4, 449.0f), 0x7e);        // saturation (torchao), not NaN
  EXPECT_EQ(fp8_encode(kE4, 464.0f), 0x7e);        // the midpoint to 480 too
  EXPECT_EQ(fp8_encode(kE4, 1e30f), 0x7e);
  EXPECT_EQ(fp8_encode(kE4, kInf), 0x7e);
  EXPECT_EQ(fp8_encode(kE4, -kInf), 0xfe);
  EXPECT_EQ(fp8_encode(kE4, kNaN), 0x7f);          // S.1111.111
  EXPECT_EQ(fp8_encode(kE4, -kNaN), 0xff);
  EXPECT_EQ(fp8_encode(kE4, 0x1p-6f), 0x08);       // the smallest normal
  EXPECT_EQ(fp8_encode(kE4, 0x1p-9f), 0x01);       // the smallest subnormal
  EXPECT_EQ(fp8_encode(kE4, 7 * 0x1p-9f), 0x07);   // the largest subnormal
  EXPECT_EQ(fp8_encode(kE4, 7.5f * 0x1p-9f), 0x08);  // tie between 7 and 8 subnormal steps: even
  EXPECT_EQ(fp8_encode(kE4, 0x1p-10f), 0x00);      // tie between 0 and 2^-9: even (zero)
  EXPECT_EQ(fp8_encode(kE4, 0x1.0002p-10f), 0x01);  // just above the tie
  EXPECT_EQ(fp8_encode(kE4, 1.5f * 0x1p-9f), 0x02);  // tie between 1 and 2: even
  EXPECT_EQ(fp8_encode(kE4, 1.0625f), 0x38);       // tie 1.0 / 1.125: even (1.0)
  EXPECT_EQ(fp8_encode(kE4, 1.1875f), 0x3a);       // tie 1.125 / 1.25: even (1.25)
  EXPECT_EQ(fp8_encode(kE4, 1.07f), 0x39);
  EXPECT_EQ(fp8_encode(kE4, -0.0f), 0x80);
  EXPECT_EQ(fp8_encode(kE4, 1e-30f), 0x00);        // underflow to zero
  EXPECT_EQ(fp8_encode(kE4, 0x1p-140f), 0x00);     // an f32 subnormal
  EXPECT_EQ(fp8_decode(kE4, 0x7e), 448.0f);
  EXPECT_EQ(fp8_decode(kE4, 0x01), 0x1p-9f);
  EXPECT_EQ(fp8_decode(kE4, 0x3c), 1.5f);
  EXPECT_TRUE(std::isnan(fp8_decode(kE4, 0x7f)));
  EXPECT_TRUE(std::isnan(fp8_decode(kE4, 0xff)));
  EXPECT_EQ(fp8_decode(kE4, 0x78), 256.0f);        // 0.1111.000 is finite in E4M3 (no inf)
}

TEST(Fp8, E5M2HandCheckedCodes) {
  EXPECT_EQ(fp8_encode(kE5, 1.0f), 0x3c);          // 0.01111.00
  EXPECT_EQ(fp8_encode(kE5, 57344.0f), 0x7b);      // the largest finite, 0.11110.11
  EXPECT_EQ(fp8_encode(kE5, 61440.0f), 0x7b);      // the midpoint to 2^16: saturated
  EXPECT_EQ(fp8_encode(kE5, kInf), 0x7b);          // saturation: inf is not kept
  EXPECT_EQ(fp8_encode(kE5, -kInf), 0xfb);
  EXPECT_EQ(fp8_encode(kE5, kNaN), 0x7f);
  EXPECT_EQ(fp8_encode(kE5, 0x1p-14f), 0x04);      // the smallest normal
  EXPECT_EQ(fp8_encode(kE5, 0x1p-16f), 0x01);      // the smallest subnormal
  EXPECT_EQ(fp8_encode(kE5, 0x1p-17f), 0x00);      // tie: even (zero)
  EXPECT_EQ(fp8_encode(kE5, 3 * 0x1p-17f), 0x02);  // tie 1 / 2 steps: even
  EXPECT_EQ(fp8_encode(kE5, 1.125f), 0x3c);        // tie 1.0 / 1.25: even
  EXPECT_EQ(fp8_encode(kE5, 1.375f), 0x3e);        // tie 1.25 / 1.5: even
  EXPECT_EQ(fp8_encode(kE5, -3.0f), 0xc2);         // 1.10000.10 = -1.5 x 2
  EXPECT_EQ(fp8_decode(kE5, 0x7c), kInf);
  EXPECT_EQ(fp8_decode(kE5, 0xfc), -kInf);
  EXPECT_TRUE(std::isnan(fp8_decode(kE5, 0x7d)));
  EXPECT_TRUE(std::isnan(fp8_decode(kE5, 0xfe)));
  EXPECT_EQ(fp8_decode(kE5, 0x03), 3 * 0x1p-16f);
}

// Every code: the decoder is the spec's formula, every finite code encodes back to itself, each
// value is exact in bf16 (so widening to bf16 for the GEMM loses nothing), inf saturates, NaN
// stays NaN.
TEST(Fp8, All256CodesRoundTrip) {
  for (Fp8Format f : {kE4, kE5}) {
    int finite = 0;
    for (int c = 0; c < 256; ++c) {
      const auto code = static_cast<uint8_t>(c);
      const float v = fp8_decode(f, code);
      const double want = ref::fp8_value_ref(f, code);
      SCOPED_TRACE(testing::Message() << fp8_format_name(f) << " code " << c);
      if (std::isnan(want)) {
        EXPECT_TRUE(std::isnan(v));
        EXPECT_EQ(fp8_encode(f, v) & 0x7f, 0x7f);
        continue;
      }
      EXPECT_EQ(static_cast<double>(v), want);
      EXPECT_EQ(f32_from_bf16(bf16_from_f32(v)), v);
      if (std::isinf(v)) {
        EXPECT_EQ(fp8_encode(f, v), (c & 0x80) | 0x7b);
        continue;
      }
      ++finite;
      EXPECT_EQ(fp8_encode(f, v), code);
      EXPECT_EQ(ref::fp8_encode_ref(f, v), code);
    }
    EXPECT_EQ(finite, f == kE4 ? 254 : 248);
  }
}

// The encoder's bit arithmetic against the nearest-code search, on random f32 bit patterns (all
// exponents, so subnormals, overflow and NaN) and on every midpoint between neighbours.
TEST(Fp8, EncoderMatchesBruteForce) {
  std::mt19937 rng(11);
  for (Fp8Format f : {kE4, kE5}) {
    for (int i = 0; i < 200000; ++i) {
      const uint32_t bits = rng();
      float y;
      std::memcpy(&y, &bits, 4);
      ASSERT_EQ(fp8_encode(f, y), ref::fp8_encode_ref(f, y)) << "bits " << std::hex << bits;
    }
    std::uniform_real_distribution<float> near(-2.0f * fp8_max(f), 2.0f * fp8_max(f));
    for (int i = 0; i < 50000; ++i) {
      const float y = near(rng) * std::ldexp(1.0f, -static_cast<int>(rng() % 40));
      ASSERT_EQ(fp8_encode(f, y), ref::fp8_encode_ref(f, y)) << y;
    }
    for (int c = 0; c < (f == kE4 ? 0x7e : 0x7b); ++c) {
      const float mid = (fp8_decode(f, c) + fp8_decode(f, c + 1)) / 2;  // exact in f32
      ASSERT_EQ(fp8_encode(f, mid), ref::fp8_encode_ref(f, mid)) << mid;
      ASSERT_EQ(fp8_encode(f, mid) & 1, 0) << "tie at " << mid;
    }
  }
}

TEST(Fp8, ScaleIsMaxOverAmax) {
  EXPECT_EQ(fp8_scale(2.0f, kE4), 224.0f);
  EXPECT_EQ(fp8_scale(448.0f, kE4), 1.0f);
  EXPECT_EQ(fp8_scale(57344.0f, kE5), 1.0f);
  EXPECT_EQ(fp8_scale(0.0f, kE4), 448.0f / 1e-12f);  // torchao's EPS floor
  EXPECT_TRUE(std::isnan(fp8_scale(kInf, kE4)));
  EXPECT_TRUE(std::isnan(fp8_scale(kNaN, kE5)));
}

// Values spanning every binade that matters once scaled, plus specials.
std::vector<float> test_values(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g;
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = g(rng) * std::ldexp(1.0f, static_cast<int>(rng() % 30) - 20);
  const float specials[] = {0.0f, -0.0f, kInf, -kInf, kNaN, 0x1p-140f, 1e30f, -1e30f};
  for (size_t i = 0; i < std::size(specials) && i * 97 < n; ++i) v[i * 97] = specials[i];
  return v;
}

TEST(Fp8, QuantizeMatchesReferenceBitForBit) {
  for (DType dt : {DType::f32, DType::bf16})
    for (Fp8Format f : {kE4, kE5})
      for (int64_t n : {1, 15, 17, 1000, 40001}) {  // tails; 40001 runs on several threads
        SCOPED_TRACE(testing::Message() << dtype_name(dt) << " " << fp8_format_name(f) << " n " << n);
        MemoryPool pool;
        std::vector<float> v = test_values(static_cast<size_t>(n), static_cast<uint32_t>(n));
        if (dt == DType::bf16)
          for (float& x : v) x = f32_from_bf16(bf16_from_f32(x));
        Tensor x = make_tensor(pool, {n}, dt);
        std::vector<double> vd(v.begin(), v.end());
        test::copy_in_any(x, vd);
        const float scale = fp8_scale(3.0f, f);
        Tensor codes = make_tensor(pool, {n}, DType::u8);
        fp8_quantize(x, scale, f, codes);
        std::vector<uint8_t> want(static_cast<size_t>(n));
        ref::fp8_quantize_ref(v.data(), n, scale, f, want.data());
        const auto* got = static_cast<const uint8_t*>(codes.raw_data());
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << "at " << i << " x " << v[i];
      }
}

// --precision fp8's stored weights (Note [FP8], "Storage"): the codes of f32 values rounded to
// bf16 first are the reference's codes of the bf16 values (the cast of the bf16 working copy
// they replace), and differ from the direct codes of the f32 values (a double rounding) on
// values just past a tie; the amax is the bf16 copy's.
TEST(Fp8, QuantizeViaBf16IsTheBf16CopysReferenceCodes) {
  for (Fp8Format f : {kE4, kE5})
    for (int64_t n : {1, 15, 17, 1000, 40001}) {
      SCOPED_TRACE(testing::Message() << fp8_format_name(f) << " n " << n);
      MemoryPool pool;
      const std::vector<float> v = test_values(static_cast<size_t>(n), static_cast<uint32_t>(n) + 7);
      std::vector<float> rounded(v);
      for (float& x : rounded) x = f32_from_bf16(bf16_from_f32(x));
      Tensor x = make_tensor(pool, {n}, DType::f32);
      std::memcpy(x.raw_data(), v.data(), v.size() * sizeof(float));
      const float scale = fp8_scale_pow2(3.0f, f);
      Tensor codes = make_tensor(pool, {n}, DType::u8);
      fp8_quantize_via_bf16(x, scale, f, codes);
      std::vector<uint8_t> want(static_cast<size_t>(n));
      ref::fp8_quantize_ref(rounded.data(), n, scale, f, want.data());
      const auto* got = static_cast<const uint8_t*>(codes.raw_data());
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(got[i], want[i]) << "at " << i << " x " << v[i];
      // The amax: NaN where one is present (test_values plants one in the longer inputs), else the
      // bf16 copy's exact amax.
      const float a = fp8_amax_via_bf16(x);
      float want_a = 0;
      bool nan = false;
      for (float r : rounded) nan = nan || std::isnan(r), want_a = std::isnan(r) ? want_a : std::max(want_a, std::fabs(r));
      if (nan)
        EXPECT_TRUE(std::isnan(a));
      else
        EXPECT_EQ(a, want_a);
    }
  // Just past E4M3's tie between 1 and 1.125: bf16 rounds it onto the tie, which goes to the
  // even code (1.0); the f32 value itself is nearer 1.125.
  MemoryPool pool;
  Tensor x = make_tensor(pool, {1}, DType::f32);
  x.data<float>()[0] = 1.0625f + 0x1p-12f;
  Tensor codes = make_tensor(pool, {1}, DType::u8);
  fp8_quantize_via_bf16(x, 1.0f, kE4, codes);
  EXPECT_EQ(fp8_decode(kE4, static_cast<uint8_t*>(codes.raw_data())[0]), 1.0f);
  fp8_quantize(x, 1.0f, kE4, codes);
  EXPECT_EQ(fp8_decode(kE4, static_cast<uint8_t*>(codes.raw_data())[0]), 1.125f);
}

TEST(Fp8, DequantizeIsDecodeTimesInverseScaleRoundedOnce) {
  for (DType dt : {DType::f32, DType::bf16})
    for (Fp8Format f : {kE4, kE5}) {
      MemoryPool pool;
      const int64_t n = 256 * 3 + 5;
      Tensor codes = make_tensor(pool, {n}, DType::u8);
      auto* c = static_cast<uint8_t*>(codes.raw_data());
      for (int64_t i = 0; i < n; ++i) c[i] = static_cast<uint8_t>(i * 7);
      for (float inv : {1.0f, 0.0123f}) {
        Tensor x = make_tensor(pool, {n}, dt);
        fp8_dequantize(codes, f, inv, x);
        const std::vector<double> got = test::to_doubles_any(x);
        for (int64_t i = 0; i < n; ++i) {
          const double want = test::round_to(dt, fp8_decode(f, c[i]) * inv);
          if (std::isnan(want))
            ASSERT_TRUE(std::isnan(got[i])) << i;
          else
            ASSERT_EQ(got[i], want) << "code " << int(c[i]) << " inv " << inv;
        }
      }
    }
}

TEST(Fp8, AmaxIsExactAndSeesNaNAndInf) {
  MemoryPool pool;
  for (DType dt : {DType::f32, DType::bf16}) {
    const int64_t n = 50001;
    Tensor x = make_tensor(pool, {n}, dt);
    std::vector<double> v = test::rounded(dt, test::random_values(n, 5, -2.0, 2.0));
    v[40000] = -7.5;  // the largest magnitude is negative, on a later thread's range
    test::copy_in_any(x, v);
    EXPECT_EQ(fp8_amax(x), 7.5f);
    v[n - 1] = kInf;
    test::copy_in_any(x, v);
    EXPECT_EQ(fp8_amax(x), kInf);
    v[3] = kNaN;
    test::copy_in_any(x, v);
    EXPECT_TRUE(std::isnan(fp8_amax(x)));
  }
}

TEST(Fp8, PowerOfTwoScaleRoundsDown) {
  EXPECT_EQ(fp8_scale_pow2(2.0f, kE4), 128.0f);     // 224 -> 128
  EXPECT_EQ(fp8_scale_pow2(3.5f, kE4), 128.0f);     // 128 exactly stays
  EXPECT_EQ(fp8_scale_pow2(3.6f, kE4), 64.0f);
  EXPECT_EQ(fp8_scale_pow2(448.0f, kE4), 1.0f);
  EXPECT_EQ(fp8_scale_pow2(1.0f, kE5), 32768.0f);   // 57344 -> 2^15
  EXPECT_EQ(fp8_scale_pow2(1e-3f, kE5), 33554432.0f);  // 5.7e7 -> 2^25
  EXPECT_TRUE(std::isnan(fp8_scale_pow2(kInf, kE4)));
}

// The fused cast-and-back is quantize then dequantize, bit for bit, in every type pair; with a
// power-of-two scale its bf16 output is the f32 output exactly (what the FP8 GEMM route needs).
TEST(Fp8, RoundTripIsQuantizeThenDequantize) {
  for (DType st : {DType::f32, DType::bf16})
    for (DType dt : {DType::f32, DType::bf16})
      for (Fp8Format f : {kE4, kE5})
        for (float scale : {fp8_scale(2.7f, f), fp8_scale_pow2(2.7f, f)}) {
          SCOPED_TRACE(testing::Message() << dtype_name(st) << "->" << dtype_name(dt) << " "
                                          << fp8_format_name(f) << " scale " << scale);
          MemoryPool pool;
          const int64_t n = 20011;
          std::vector<float> v = test_values(static_cast<size_t>(n), 9);
          Tensor x = make_tensor(pool, {n}, st);
          test::copy_in_any(x, std::vector<double>(v.begin(), v.end()));
          Tensor codes = make_tensor(pool, {n}, DType::u8);
          fp8_quantize(x, scale, f, codes);
          Tensor want = make_tensor(pool, {n}, dt), got = make_tensor(pool, {n}, dt);
          fp8_dequantize(codes, f, 1.0f / scale, want);
          fp8_round_trip(x, scale, f, got);
          const std::vector<double> a = test::to_doubles_any(want), b = test::to_doubles_any(got);
          for (int64_t i = 0; i < n; ++i) {
            if (std::isnan(a[i])) {
              ASSERT_TRUE(std::isnan(b[i])) << i;
              continue;
            }
            ASSERT_EQ(a[i], b[i]) << "at " << i;
            const bool pow2 = scale == fp8_scale_pow2(2.7f, f);
            if (pow2 && dt == DType::f32) {
              ASSERT_EQ(test::round_to(DType::bf16, a[i]), a[i]) << "not exact in bf16 at " << i;
            }
          }
        }
}

TEST(Fp8, CastDynamicUsesTheTensorsOwnAmax) {
  MemoryPool pool;
  const int64_t n = 4097;
  Tensor x = make_tensor(pool, {n}, DType::bf16), y = make_tensor(pool, {n}, DType::bf16);
  std::vector<double> v = test::rounded(DType::bf16, test::random_values(n, 2, -3.0, 3.0));
  v[100] = 5.0;
  test::copy_in_any(x, v);
  EXPECT_EQ(fp8_cast_dynamic(x, kE4, y), 64.0f);  // 448 / 5 = 89.6 -> 64
  const std::vector<double> got = test::to_doubles_any(y);
  EXPECT_EQ(got[100], 5.0);                        // 320 = 1.25 x 2^8 is an E4M3 value
  for (int64_t i = 0; i < n; ++i) {
    const double want = fp8_decode(kE4, fp8_encode(kE4, static_cast<float>(v[i]) * 64.0f)) / 64.0;
    ASSERT_EQ(got[i], want) << i;
    ASSERT_LE(std::fabs(got[i] - v[i]), std::fabs(v[i]) * 0x1p-4 + 0x1p-9 / 64.0) << i;
  }
  v[7] = kNaN;
  test::copy_in_any(x, v);
  EXPECT_TRUE(std::isnan(fp8_cast_dynamic(x, kE5, y)));
  for (double g : test::to_doubles_any(y)) ASSERT_TRUE(std::isnan(g));
}

// Note [FP8]'s claim: the cast operands, descaled by powers of two, are exact bf16 values, so
// the bf16 GEMM (oneDNN's, or widened to f32 where the CPU has no bf16 matmul) computes the FP8
// product with the scales applied to an f32 accumulator: here against the codes' product summed
// in double and scaled once, within f32 accumulation's rounding.
TEST(Fp8, Bf16GemmOfCastOperandsIsTheScaledFp8Product) {
  MemoryPool pool;
  const int64_t R = 7, IC = 37, OC = 5;
  Tensor x = test::random_any(pool, {R, IC}, DType::bf16, 3, nullptr, -4.0, 4.0);
  Tensor w = test::random_any(pool, {OC, IC}, DType::bf16, 4, nullptr, -0.3, 0.3);
  Tensor x8 = make_tensor(pool, {R, IC}, DType::bf16), w8 = make_tensor(pool, {OC, IC}, DType::bf16);
  const float sx = fp8_cast_dynamic(x, kE4, x8), sw = fp8_cast_dynamic(w, kE4, w8);
  Tensor cx = make_tensor(pool, {R, IC}, DType::u8), cw = make_tensor(pool, {OC, IC}, DType::u8);
  fp8_quantize(x, sx, kE4, cx);
  fp8_quantize(w, sw, kE4, cw);
  Tensor out = make_tensor(pool, {R, OC}), none;
  test::routed_forward(pool, out, x8, w8, none);
  const auto* a = static_cast<const uint8_t*>(cx.raw_data());
  const auto* b = static_cast<const uint8_t*>(cw.raw_data());
  const float* got = out.data<float>();
  for (int64_t r = 0; r < R; ++r)
    for (int64_t o = 0; o < OC; ++o) {
      double acc = 0, mag = 0;
      for (int64_t k = 0; k < IC; ++k) {
        const double t = double(fp8_decode(kE4, a[r * IC + k])) * fp8_decode(kE4, b[o * IC + k]);
        acc += t;
        mag += std::fabs(t);
      }
      const double want = acc / (double(sx) * sw);
      ASSERT_NEAR(got[r * OC + o], want, IC * 0x1p-24 * mag / (double(sx) * sw) + 1e-30)
          << r << "," << o;
    }
}

TEST(Fp8, RejectsWrongTypes) {
  MemoryPool pool;
  Tensor x = make_tensor(pool, {8}, DType::f16);
  Tensor codes = make_tensor(pool, {8}, DType::u8);
  EXPECT_THROW(fp8_quantize(x, 1.0f, kE4, codes), Error);
  Tensor y = make_tensor(pool, {8});
  Tensor short_codes = make_tensor(pool, {7}, DType::u8);
  EXPECT_THROW(fp8_quantize(y, 1.0f, kE4, short_codes), Error);
}

}  // namespace
}  // namespace memfit::kernels
