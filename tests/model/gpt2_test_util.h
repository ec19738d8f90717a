// Shared by the model tests: a small model with odd sizes and seeded batches of tokens.
#pragma once

#include <cstdint>
#include <random>

#include "memfit/memory/tensor.h"
#include "memfit/model/model_config.h"

namespace memfit::gpt2_test {

inline void fill_tokens(Tensor& t, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  int32_t* ids = t.data<int32_t>();
  for (int64_t i = 0; i < t.numel(); ++i) ids[i] = static_cast<int32_t>(rng() % vocab);
}

struct Batch {
  Tensor tokens, targets;
  Batch(MemoryPool& pool, int B, int T, int vocab, uint32_t seed) {
    tokens = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "tokens");
    targets = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "targets");
    fill_tokens(tokens, vocab, seed);
    fill_tokens(targets, vocab, seed + 1);
  }
};

inline ModelConfig odd_config(Family family = Family::gpt2) {
  ModelConfig c;  // odd sizes on purpose: vocab not a multiple of 64, T below the context
  c.family = family;
  c.n_layer = 2;
  c.n_head = 3;
  c.d_model = 24;
  c.max_seq_len = 16;
  c.vocab_size = 70;
  if (family == Family::llama) {  // grouped-query heads (4 of head size 6 over 2), untied head
    c.n_head = 4;
    c.n_kv_head = 2;
    c.ffn_dim = 40;
    c.tie_embeddings = false;
  }
  c.finalize();
  return c;
}

// odd_config with three blocks: enough for recomputed segments, a kept block and a top one.
inline ModelConfig three_layers(Family family = Family::gpt2) {
  ModelConfig c = odd_config(family);
  c.n_layer = 3;
  c.finalize();
  return c;
}

}  // namespace memfit::gpt2_test
