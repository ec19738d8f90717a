#include "memfit/core/cpu.h"

#include <cpuid.h>

#include <array>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string_view>

#include <fmt/format.h>

#include "memfit/core/error.h"

namespace memfit::cpu {
namespace {

constexpr std::array<std::string_view, 5> kNames = {"scalar", "avx2", "avx512", "avx512_bf16",
                                                    "amx"};

struct Regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

Regs cpuid(unsigned leaf, unsigned sub) {
  Regs r;
  if (!__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d)) return Regs{};
  return r;
}

bool bit(unsigned v, int i) { return (v >> i) & 1u; }

// XCR0: which register states the OS saves on a context switch (bit 1 SSE, 2 AVX, 5-7 the
// AVX-512 opmask and upper registers, 17-18 the AMX tile config and data).
uint64_t xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

Isa detect() {
  const Regs l1 = cpuid(1, 0);
  if (!bit(l1.c, 27)) return Isa::scalar;  // no OSXSAVE: no xgetbv, no AVX state
  const uint64_t x = xcr0();
  const bool os_avx = (x & 0x6) == 0x6, os_avx512 = (x & 0xe6) == 0xe6;
  const bool os_amx = (x & 0x60000) == 0x60000;
  const Regs l7 = cpuid(7, 0), l7s1 = cpuid(7, 1);
  const bool avx2 = os_avx && bit(l1.c, 12) /*fma*/ && bit(l1.c, 29) /*f16c*/ &&
                    bit(l1.c, 28) /*avx*/ && bit(l7.b, 5) /*avx2*/;
  if (!avx2) return Isa::scalar;
  const bool avx512 = os_avx512 && bit(l7.b, 16) /*f*/ && bit(l7.b, 17) /*dq*/ &&
                      bit(l7.b, 30) /*bw*/ && bit(l7.b, 31) /*vl*/;
  if (!avx512) return Isa::avx2;
  if (!bit(l7s1.a, 5)) return Isa::avx512;  // AVX512_BF16
  const bool amx = os_amx && bit(l7.d, 22) /*amx-bf16*/ && bit(l7.d, 24) /*amx-tile*/;
  return amx ? Isa::amx : Isa::avx512_bf16;
}

Isa cap_from_env() {
  const char* v = std::getenv("MEMFIT_MAX_ISA");
  if (v == nullptr || *v == '\0') return Isa::amx;
  return isa_from_name(v, "MEMFIT_MAX_ISA");
}

}  // namespace

std::string_view isa_name(Isa isa) { return kNames[static_cast<size_t>(isa)]; }

Isa isa_from_name(std::string_view name, std::string_view source) {
  for (size_t i = 0; i < kNames.size(); ++i)
    if (kNames[i] == name) return static_cast<Isa>(i);
  MEMFIT_THROW(ConfigError, "cpu", "{} must be scalar, avx2, avx512, avx512_bf16 or amx, got '{}'",
               source, name);
}

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

Isa max_isa() {
  static const Isa isa = std::min(detected_isa(), cap_from_env());
  return isa;
}

bool has(Isa isa) { return max_isa() >= isa; }

bool capped() { return max_isa() < detected_isa(); }

namespace {

// The value of `key` in /proc/cpuinfo's first processor block ("model name : AMD EPYC" gives
// "AMD EPYC" for "model name"), empty where it is not listed.
std::string cpuinfo_value(std::string_view key) {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line) && !line.empty();) {
    const size_t colon = line.find(':');
    if (colon == std::string::npos || colon == 0) continue;
    const size_t end = line.find_last_not_of(" \t", colon - 1);
    if (end == std::string::npos || std::string_view(line).substr(0, end + 1) != key) continue;
    const size_t start = line.find_first_not_of(" \t", colon + 1);
    return start == std::string::npos ? std::string() : line.substr(start);
  }
  return {};
}

std::string read_model_name() {
  if (std::string name = cpuinfo_value("model name"); !name.empty()) return name;
  std::array<unsigned, 12> brand{};
  for (unsigned i = 0; i < 3; ++i) {
    const Regs r = cpuid(0x80000002u + i, 0);
    brand[i * 4] = r.a, brand[i * 4 + 1] = r.b, brand[i * 4 + 2] = r.c, brand[i * 4 + 3] = r.d;
  }
  std::string s(reinterpret_cast<const char*>(brand.data()), sizeof(brand));
  s.resize(std::strlen(s.c_str()));
  return s;
}

std::string read_identity() {
  const std::string family = cpuinfo_value("cpu family"), model = cpuinfo_value("model");
  if (family.empty() || model.empty()) return model_name();
  return fmt::format("{} (family {}, model {})", model_name(), family, model);
}

}  // namespace

// Read once: the CPU does not change under a process, and machine_calibration asks for the
// identity at every call (a layout search's step-time estimates read /proc/cpuinfo three times a
// candidate: 5% of its CPU time, perf).
std::string model_name() {
  static const std::string name = read_model_name();
  return name;
}

std::string identity() {
  static const std::string id = read_identity();
  return id;
}

}  // namespace memfit::cpu
