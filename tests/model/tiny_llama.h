// A tiny LLaMA config for layout and pipeline tests: 4 heads (2 key/value), width 32, MLP 40,
// 90 tokens, 16 positions, `n_layer` blocks, the head tied or not; finalized.
#pragma once

#include "memfit/model/model_config.h"

namespace memfit::test {

inline ModelConfig tiny_llama(int n_layer, bool tied = false) {
  ModelConfig c;
  c.family = Family::llama;
  c.n_layer = n_layer;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_model = 32;
  c.ffn_dim = 40;
  c.max_seq_len = 16;
  c.vocab_size = 90;
  c.tie_embeddings = tied;
  c.finalize();
  return c;
}

}  // namespace memfit::test
