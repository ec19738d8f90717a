#include "memfit/core/cpu.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <string>

#include "memfit/core/error.h"

namespace memfit::cpu {
namespace {

// The flags line of /proc/cpuinfo, padded with spaces so " flag " finds whole words.
std::string cpuinfo_flags() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("flags", 0) == 0) return line.substr(line.find(':') + 1) + " ";
  return "";
}

TEST(Cpu, DetectionAgreesWithTheKernelsFlags) {
  const std::string flags = cpuinfo_flags();
  if (flags.empty()) GTEST_SKIP() << "no /proc/cpuinfo flags line to compare with";
  auto has_flag = [&](const char* f) { return flags.find(std::string(" ") + f + " ") != std::string::npos; };
  const bool avx2 = has_flag("avx2") && has_flag("fma") && has_flag("f16c");
  const bool avx512 = avx2 && has_flag("avx512f") && has_flag("avx512bw") &&
                      has_flag("avx512dq") && has_flag("avx512vl");
  const bool bf16 = avx512 && has_flag("avx512_bf16");
  const bool amx = bf16 && has_flag("amx_bf16") && has_flag("amx_tile");
  const Isa expected = amx      ? Isa::amx
                       : bf16   ? Isa::avx512_bf16
                       : avx512 ? Isa::avx512
                       : avx2   ? Isa::avx2
                                : Isa::scalar;
  EXPECT_EQ(isa_name(detected_isa()), isa_name(expected)) << "flags:" << flags;
}

TEST(Cpu, TheCapLowersNeverRaises) {
  const char* env = std::getenv("MEMFIT_MAX_ISA");
  const Isa cap = env && *env ? isa_from_name(env, "MEMFIT_MAX_ISA") : Isa::amx;
  EXPECT_EQ(max_isa(), std::min(cap, detected_isa()));
  EXPECT_EQ(capped(), max_isa() < detected_isa());
  EXPECT_TRUE(has(Isa::scalar));
  EXPECT_EQ(has(Isa::avx2), max_isa() >= Isa::avx2);
}

TEST(Cpu, NamesRoundTripAndABadNameSaysWhere) {
  for (Isa i : {Isa::scalar, Isa::avx2, Isa::avx512, Isa::avx512_bf16, Isa::amx})
    EXPECT_EQ(isa_from_name(isa_name(i), "test"), i);
  try {
    isa_from_name("sse9", "MEMFIT_MAX_ISA");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("MEMFIT_MAX_ISA"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("sse9"), std::string::npos) << e.what();
  }
}

TEST(Cpu, ModelNameIsKnown) { EXPECT_FALSE(model_name().empty()); }

// The calibration's key: the model name, and the family and model numbers where listed (on x86
// Linux they are), so two generations sold under one name get two keys.
TEST(Cpu, IdentityIsTheModelNameWithFamilyAndModel) {
  const std::string id = identity();
  EXPECT_EQ(id.rfind(model_name(), 0), 0u) << id;
  std::ifstream f("/proc/cpuinfo");
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (all.find("cpu family") != std::string::npos) {
    EXPECT_NE(id.find("(family "), std::string::npos) << id;
    EXPECT_NE(id.find(", model "), std::string::npos) << id;
  }
}

}  // namespace
}  // namespace memfit::cpu
