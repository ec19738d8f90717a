// GPT-2's table: its fixed shape (4 d_model MLP, no grouped heads, a tied head), its LayerNorm
// as the final norm, and the scaled initialisation of its residual projections.
#include "memfit/model/gpt2/gpt2_family.h"

#include <cmath>

#include <fmt/format.h>

#include "memfit/kernels/cpu/fill.h"
#include "memfit/kernels/cpu/layernorm.h"
#include "memfit/model/gpt2/gpt2_block.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/step_context.h"

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

// LayerNorm: the mean and rstd are saved (f32), then the output.
void final_norm_forward(StepContext& ctx, const ModelConfig&, const std::string& tag, int64_t n,
                        const Tensor& x, const Tensor& out, const ModelWeights& w) {
  Tensor mean = ctx.write(tag + ".mean", {n}, DType::f32, Category::activations);
  Tensor rstd = ctx.write(tag + ".rstd", {n}, DType::f32, Category::activations);
  if (!ctx.running()) return;
  Tensor o = out;
  kernels::layernorm_forward(o, mean, rstd, x, w.norm_w, w.norm_b);
}

void final_norm_backward(StepContext& ctx, const std::string& tag, const Tensor& dx,
                         const Tensor& dout, const Tensor& x, const ModelWeights& w,
                         const ModelWeights& g) {
  Tensor mean = ctx.read(tag + ".mean");
  Tensor rstd = ctx.read(tag + ".rstd");
  if (!ctx.running()) return;
  Tensor d = dx, dw = g.norm_w, db = g.norm_b;
  kernels::zero(d);
  kernels::layernorm_backward(d, dw, db, dout, x, w.norm_w, mean, rstd);
}

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
      .fix_shape = fix_shape,
      .describe = describe,
      .residual_init_scale = residual_init_scale,
      .block_forward = gpt2_block_forward,
      .block_backward = gpt2_block_backward,
      .final_norm_forward = final_norm_forward,
      .final_norm_backward = final_norm_backward,
  };
  return kGpt2;
}

}  // namespace memfit
