// The LLaMA family's table: its open shape (grouped key/value heads, the MLP width, the rotary
// base, an untied head) and rotary positions (its block and RMSNorm: llama_compute.cpp).
#include "memfit/model/llama/llama_family.h"

#include <fmt/format.h>

namespace memfit {

namespace {

void fix_shape(ModelConfig&) {}  // every field is the preset's, the options' or config.json's

std::string describe(const ModelConfig& c) {
  return fmt::format(
      "LLaMA: {} layers, {} heads ({} key/value), width {}, MLP {}, context {}, vocab {} "
      "(padded {}), {} head",
      c.n_layer, c.n_head, c.n_kv_head, c.d_model, c.ffn_dim, c.max_seq_len, c.vocab_size,
      c.padded_vocab, c.tie_embeddings ? "tied" : "untied");
}

double residual_init_scale(const ModelConfig&) { return 1.0; }

}  // namespace

const ModelFamily& llama_family() {
  static const ModelFamily kLlama{
      .id = Family::llama,
      .name = "llama",
      .display_name = "LLaMA",
      .fc_matrices = 2,
      .rotary = true,
      .shape_options = true,
      .final_norm_tag = "norm",
      .block_prefix = "model.layers",
      .hf_prefix = "",
      .hf_transposed = false,
      .fix_shape = fix_shape,
      .describe = describe,
      .residual_init_scale = residual_init_scale,
  };
  return kLlama;
}

}  // namespace memfit
