// GPT-2's table: its fixed shape (4 d_model MLP, no grouped heads, a tied head) and the scaled
// initialisation of its residual projections (its block and LayerNorm: gpt2_compute.cpp).
#include "memfit/model/gpt2/gpt2_family.h"

#include <cmath>

#include <fmt/format.h>

namespace memfit {

namespace {

// GPT-2's shape has no such knobs: its MLP is 4 d_model wide, every head has its own keys and
// values, and the head is the token embedding (the options refuse to set them).
void fix_shape(ModelConfig& c) {
  c.n_kv_head = c.n_head;
  c.ffn_dim = 4 * c.d_model;
  c.tie_embeddings = true;
}

std::string describe(const ModelConfig& c) {
  return fmt::format("{} layers, {} heads, width {}, context {}, vocab {} (padded {})", c.n_layer,
                     c.n_head, c.d_model, c.max_seq_len, c.vocab_size, c.padded_vocab);
}

// The GPT-2 paper's 1 / sqrt(N) for N residual layers, two per block.
double residual_init_scale(const ModelConfig& c) { return 1.0 / std::sqrt(2.0 * c.n_layer); }

}  // namespace

const ModelFamily& gpt2_family() {
  static const ModelFamily kGpt2{
      .id = Family::gpt2,
      .name = "gpt2",
      .display_name = "GPT-2",
      .fc_matrices = 1,
      .rotary = false,
      .shape_options = false,
      .final_norm_tag = "ln_f",
      .block_prefix = "h",
      .hf_prefix = "transformer.",
      .hf_transposed = true,
      .fix_shape = fix_shape,
      .describe = describe,
      .residual_init_scale = residual_init_scale,
  };
  return kGpt2;
}

}  // namespace memfit
