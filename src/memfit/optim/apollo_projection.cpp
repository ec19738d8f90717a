// The counter-based Gaussian generator of APOLLO's projections (apollo_projection.h).
#include "memfit/optim/apollo_projection.h"

#include <cmath>
#include <numbers>

namespace memfit {

uint64_t splitmix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t apollo_projection_key(uint64_t seed, uint64_t index, uint64_t window) {
  return splitmix64(splitmix64(splitmix64(seed) + index) + window);
}

void apollo_projection_fill(float* out, int64_t n, uint64_t key, int rank) {
  const double inv = 1.0 / std::sqrt(static_cast<double>(rank)), two53 = 0x1p-53;
#pragma omp parallel for schedule(static) if (n >= 4096)
  for (int64_t k = 0; k < (n + 1) / 2; ++k) {
    const uint64_t a = splitmix64(key + 2 * static_cast<uint64_t>(k));
    const uint64_t b = splitmix64(key + 2 * static_cast<uint64_t>(k) + 1);
    const double u1 = static_cast<double>((a >> 11) + 1) * two53;
    const double u2 = static_cast<double>(b >> 11) * two53;
    const double radius = std::sqrt(-2.0 * std::log(u1)), angle = 2.0 * std::numbers::pi * u2;
    out[2 * k] = static_cast<float>(radius * std::cos(angle) * inv);
    if (2 * k + 1 < n) out[2 * k + 1] = static_cast<float>(radius * std::sin(angle) * inv);
  }
}

}  // namespace memfit
