// Helpers of the NF4 tests: a quantized weight that owns its bytes, weight-like test data, and
// bit patterns.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "memfit/kernels/cpu/nf4.h"

namespace memfit::kernels::test {

// A quantized (rows, cols) weight over its own zeroed buffer of nf4_bytes(rows, cols) bytes.
struct OwnedNf4 {
  std::vector<uint32_t> storage;  // 4-byte aligned
  Nf4Weight w;
  OwnedNf4(int64_t rows, int64_t cols)
      : storage((nf4_bytes(rows, cols) + 3) / 4, 0u),
        w(Nf4Weight::view(storage.data(), rows, cols)) {}
  OwnedNf4(const OwnedNf4&) = delete;
  OwnedNf4& operator=(const OwnedNf4&) = delete;
  const uint8_t* bytes() const { return reinterpret_cast<const uint8_t*>(storage.data()); }
  size_t size() const { return nf4_bytes(w.rows, w.cols); }
  bool same_bytes(const OwnedNf4& o) const {
    return size() == o.size() && std::memcmp(bytes(), o.bytes(), size()) == 0;
  }
};

// Weight-like values: normal, each row with its own scale (0.01 .. 0.08), with `outliers`
// about one value in 50 times 8, and, when `zero_blocks`, every seventh run of 64 values zero.
inline std::vector<float> weight_values(int64_t rows, int64_t cols, uint32_t seed,
                                        bool zero_blocks = false, bool outliers = true) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> pick(0, 49);
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = 0.01f * static_cast<float>(1 + (r * 7 + seed) % 8);
    for (int64_t c = 0; c < cols; ++c) {
      float v = normal(gen) * scale;
      if (pick(gen) == 0 && outliers) v *= 8.0f;
      x[static_cast<size_t>(r * cols + c)] = v;
    }
  }
  if (zero_blocks)
    for (size_t i = 0; i < x.size(); ++i)
      if ((i / 64) % 7 == 3) x[i] = 0.0f;
  return x;
}

inline uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

}  // namespace memfit::kernels::test
