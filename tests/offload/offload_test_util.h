// What the offloaded optimizer's tests share: a scratch directory per test, byte comparison,
// deterministic gradients and the small LLaMA they step.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>

#include "memfit/memory/tensor.h"
#include "memfit/model/model_config.h"
#include "../io/io_test_util.h"

namespace memfit::offload {

struct TempDir {
  std::filesystem::path path;
  TempDir() {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    path = std::filesystem::temp_directory_path() /
           fmt::format("memfit_offload_{}_{}", ::getpid(), info->name());
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

using io::testing::first_difference;

inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

inline void fill(Tensor& t, uint32_t seed, float scale) {
  float* d = t.data<float>();
  uint32_t x = seed;
  for (int64_t i = 0; i < t.numel(); ++i) {
    x = x * 1664525u + 1013904223u;
    d[i] = scale * (static_cast<float>(x >> 8) / 16777216.0f - 0.5f);
  }
}

inline ModelConfig llama() {
  ModelConfig c = ModelConfig::preset("llama-tiny");
  c.finalize();
  return c;
}

}  // namespace memfit::offload
