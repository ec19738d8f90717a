// NF4 against bitsandbytes' algorithm as tests/reference/make_nf4_fixture.py writes it out
// (nf4_fixture.json): the code book and the decision thresholds, the dynamic map of the second
// level, and for known vectors and generated weights of odd shapes every stored byte (codes,
// 8-bit absmax, scales, offset), the f32 first-level absmax, and the dequantized f32 and bf16
// values. The fast kernels (on whichever SIMD target runs) and the reference alike.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/kernels/cpu/blockwise_quant.h"
#include "memfit/kernels/cpu/nf4.h"
#include "memfit/kernels/ref/nf4_ref.h"
#include "nf4_test_util.h"
#include "test_util.h"

namespace memfit::kernels {
namespace {

using nlohmann::json;
using test::bits_of;
using test::OwnedNf4;

const json& fixture() {
  static const json j = [] {
    std::ifstream in(MEMFIT_SOURCE_DIR "/tests/reference/nf4_fixture.json");
    EXPECT_TRUE(in.good()) << "tests/reference/nf4_fixture.json is missing";
    return json::parse(in);
  }();
  return j;
}

float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint32_t hash32(uint32_t x) {  // lowbias32, as the script's
  x ^= x >> 16;
  x *= 0x7feb352du;
  x ^= x >> 15;
  x *= 0x846ca68bu;
  x ^= x >> 16;
  return x;
}

// The script's generated(rows, cols, seed), exact in f32.
std::vector<float> generated(int64_t rows, int64_t cols, uint32_t seed) {
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) {
    int32_t s = -8190;
    for (uint32_t k = 0; k < 4; ++k)
      s += static_cast<int32_t>(hash32(seed * 0x9E3779B9u + 4u * static_cast<uint32_t>(i) + k) >> 20);
    if (hash32(seed + 77777u + static_cast<uint32_t>(i)) % 61 == 0) s *= 16;
    x[static_cast<size_t>(i)] =
        static_cast<float>(s) * std::ldexp(1.0f, -(13 + static_cast<int>((i / cols) % 4)));
  }
  return x;
}

std::string hex(const uint8_t* p, size_t n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s += digits[p[i] >> 4];
    s += digits[p[i] & 15];
  }
  return s;
}

std::string fnv1a64(const void* p, size_t n) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < n; ++i) h = (h ^ static_cast<const uint8_t*>(p)[i]) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

TEST(Nf4Fixture, CodeBookAndThresholdsAreBitsandbytes) {
  const json& f = fixture();
  ASSERT_EQ(f["nf4_values"].size(), 16u);
  for (int i = 0; i < 16; ++i) EXPECT_EQ(bits_of(kNf4Values[i]), f["nf4_values"][i].get<uint32_t>()) << i;
  ASSERT_EQ(f["nf4_thresholds"].size(), 15u);
  for (int i = 0; i < 15; ++i)
    EXPECT_EQ(bits_of(kNf4Thresholds[i]), f["nf4_thresholds"][i].get<uint32_t>()) << i;
}

TEST(Nf4Fixture, DynamicMapIsBitsandbytesWithinAnUlp) {
  // memfit's map is the exact construction rounded once; torch's f32 linspace differs from it
  // by one ulp in some entries (90 of 256 with torch 1.13 here).
  const json& f = fixture();
  const QuantMap& map = signed_dynamic_map();
  int differing = 0;
  for (int i = 0; i < 256; ++i) {
    EXPECT_EQ(bits_of(map.values[i]), f["dynamic_map_exact"][i].get<uint32_t>()) << i;
    const auto torch = static_cast<int64_t>(f["dynamic_map_torch"][i].get<uint32_t>());
    const int64_t ulps = std::llabs(static_cast<int64_t>(bits_of(map.values[i])) - torch);
    EXPECT_LE(ulps, 1) << i;
    differing += ulps != 0;
  }
  EXPECT_EQ(differing, f["dynamic_map_entries_differing"].get<int>());
}

void check_case(const json& c, bool reference) {
  const auto rows = c["rows"].get<int64_t>(), cols = c["cols"].get<int64_t>();
  const std::string name = c["name"].get<std::string>();
  SCOPED_TRACE(name + (reference ? " (reference)" : " (fast)"));
  std::vector<float> x;
  if (c.contains("input"))
    for (const auto& b : c["input"]) x.push_back(from_bits(b.get<uint32_t>()));
  else
    x = generated(rows, cols, c["seed"].get<uint32_t>());
  ASSERT_EQ(static_cast<int64_t>(x.size()), rows * cols);

  MemoryPool pool;
  OwnedNf4 q(rows, cols);
  const Nf4Layout l = nf4_layout(rows, cols);
  std::vector<float> absmax;
  if (reference) {
    ref::nf4_quantize(x.data(), q.w);
  } else {
    Tensor src = test::make_tensor(pool, {rows, cols});
    std::copy(x.begin(), x.end(), src.data<float>());
    Tensor scratch = test::make_tensor(pool, {l.blocks});
    nf4_quantize_rows(src, 0, q.w, scratch);
    absmax.assign(scratch.data<float>(), scratch.data<float>() + l.blocks);
    nf4_quantize_absmax(scratch, q.w);
    ASSERT_EQ(c["absmax"].size(), absmax.size());
    for (size_t b = 0; b < absmax.size(); ++b)
      EXPECT_EQ(bits_of(absmax[b]), c["absmax"][b].get<uint32_t>()) << "absmax " << b;
  }
  const std::string codes = c["codes"].get<std::string>();
  if (codes.size() == 16)  // an FNV-1a hash of the bytes
    EXPECT_EQ(fnv1a64(q.w.codes, l.code_bytes), codes);
  else
    EXPECT_EQ(hex(q.w.codes, l.code_bytes), codes);
  EXPECT_EQ(hex(q.w.qabsmax, static_cast<size_t>(l.blocks)), c["qabsmax"].get<std::string>());
  ASSERT_EQ(c["scales"].size(), static_cast<size_t>(l.scale_blocks));
  for (int64_t s = 0; s < l.scale_blocks; ++s)
    EXPECT_EQ(bits_of(q.w.scales[s]), c["scales"][s].get<uint32_t>()) << "scale " << s;
  EXPECT_EQ(bits_of(*q.w.offset), c["offset"].get<uint32_t>());
  for (int64_t b = 0; b < l.blocks; ++b)
    EXPECT_EQ(bits_of(q.w.block_absmax(b)), c["absmax_dequantized"][b].get<uint32_t>()) << b;

  std::vector<float> w(x.size()), wr(x.size());
  std::vector<uint16_t> wb(x.size());
  if (reference) {
    ref::nf4_dequantize(q.w, w.data());
    ref::nf4_dequantize(q.w, wr.data(), true);
    for (size_t i = 0; i < wr.size(); ++i) wb[i] = static_cast<uint16_t>(bits_of(wr[i]) >> 16);
  } else {
    Tensor f32 = test::make_tensor(pool, {rows, cols});
    Tensor bf16 = test::make_tensor(pool, {rows, cols}, DType::bf16);
    nf4_dequantize_rows(q.w, 0, f32);
    nf4_dequantize_rows(q.w, 0, bf16);
    std::copy(f32.data<float>(), f32.data<float>() + x.size(), w.begin());
    const auto* h = static_cast<const uint16_t*>(bf16.raw_data());
    std::copy(h, h + x.size(), wb.begin());
  }
  if (c.contains("dequant_f32")) {
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(bits_of(w[i]), c["dequant_f32"][i].get<uint32_t>()) << "f32 " << i;
      ASSERT_EQ(wb[i], c["dequant_bf16"][i].get<uint32_t>()) << "bf16 " << i;
    }
  } else {
    EXPECT_EQ(fnv1a64(w.data(), w.size() * 4), c["dequant_f32_fnv"].get<std::string>());
    EXPECT_EQ(fnv1a64(wb.data(), wb.size() * 2), c["dequant_bf16_fnv"].get<std::string>());
  }
}

TEST(Nf4Fixture, FastKernelsReproduceEveryCase) {
  const json& cases = fixture()["cases"];
  ASSERT_GE(cases.size(), 10u);
  for (const json& c : cases) check_case(c, false);
}

TEST(Nf4Fixture, ReferenceReproducesEveryCase) {
  for (const json& c : fixture()["cases"]) check_case(c, true);
}

TEST(Nf4Fixture, KnownVectors) {
  // The code book at absmax 2 quantizes to codes 0..15 in order and comes back exactly.
  const json* book = nullptr;
  for (const json& c : fixture()["cases"])
    if (c["name"] == "codebook_x2") book = &c;
  ASSERT_NE(book, nullptr);
  EXPECT_EQ((*book)["codes"].get<std::string>(),
            "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef");
  for (int i = 0; i < 64; ++i)
    EXPECT_EQ(from_bits((*book)["dequant_f32"][i].get<uint32_t>()), 2.0f * kNf4Values[i % 16]);
}

}  // namespace
}  // namespace memfit::kernels
