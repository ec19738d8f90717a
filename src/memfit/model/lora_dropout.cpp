// LoRA dropout's counter-based mask (lora_dropout.h).
#include "memfit/model/lora_dropout.h"

namespace memfit {

namespace {

// splitmix64's finaliser: a bijection of 64 bits whose outputs pass BigCrush as a counter's.
uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t combine(uint64_t a, uint64_t b) { return mix64(a ^ mix64(b + 0x9e3779b97f4a7c15ULL)); }

// Kept where the hash's top 32 bits are at least p 2^32.
uint64_t threshold(float p) { return static_cast<uint64_t>(static_cast<double>(p) * 4294967296.0); }

bool keeps(uint64_t key, int64_t index, uint64_t thr) {
  return (mix64(key + static_cast<uint64_t>(index) * 0x9e3779b97f4a7c15ULL) >> 32) >= thr;
}

}  // namespace

uint64_t lora_dropout_draw(uint64_t seed, int64_t step, int64_t micro_batch, int data_rank) {
  return combine(combine(combine(combine(0x4c6f5241ULL, seed), static_cast<uint64_t>(step)),
                         static_cast<uint64_t>(micro_batch)),
                 static_cast<uint64_t>(data_rank));
}

uint64_t lora_dropout_key(uint64_t draw, int layer, LinearSlot slot, int part) {
  const uint64_t site = (static_cast<uint64_t>(layer) << 16) |
                        (static_cast<uint64_t>(slot) << 8) | static_cast<uint64_t>(part);
  return combine(draw, site);
}

bool lora_dropout_keeps(uint64_t key, int64_t index, float p) {
  return keeps(key, index, threshold(p));
}

void lora_dropout_rows(float* dst, const float* src, int64_t r0, int64_t k, int64_t n, float p,
                       uint64_t key) {
  const uint64_t thr = threshold(p);
  const float s = 1.0f / (1.0f - p);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t base = (r0 + i) * n;
    for (int64_t c = 0; c < n; ++c)
      dst[i * n + c] = keeps(key, base + c, thr) ? src[i * n + c] * s : 0.0f;
  }
}

void lora_dropout_add_rows(float* dst, const float* src, int64_t r0, int64_t k, int64_t n, float p,
                           uint64_t key) {
  const uint64_t thr = threshold(p);
  const float s = 1.0f / (1.0f - p);
  for (int64_t i = 0; i < k; ++i) {
    const int64_t base = (r0 + i) * n;
    for (int64_t c = 0; c < n; ++c)
      if (keeps(key, base + c, thr)) dst[i * n + c] += src[i * n + c] * s;
  }
}

}  // namespace memfit
