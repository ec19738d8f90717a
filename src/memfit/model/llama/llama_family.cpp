// The LLaMA family's table: its open shape (grouped key/value heads, the MLP width, the rotary
// base, an untied head), rotary positions, and RMSNorm as the final norm.
#include "memfit/model/llama/llama_family.h"

#include <fmt/format.h>

#include "memfit/kernels/cpu/fill.h"
#include "memfit/kernels/cpu/rmsnorm.h"
#include "memfit/model/llama/llama_block.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/step_context.h"

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

// RMSNorm: only rstd is saved.
void final_norm_forward(StepContext& ctx, const ModelConfig& c, const std::string& tag,
                        int64_t n, const Tensor& x, const Tensor& out, const ModelWeights& w) {
  Tensor rstd = ctx.write(tag + ".rstd", {n}, DType::f32, Category::activations);
  if (!ctx.running()) return;
  Tensor o = out;
  kernels::rmsnorm_forward(o, rstd, x, w.norm_w, c.norm_eps);
}

void final_norm_backward(StepContext& ctx, const std::string& tag, const Tensor& dx,
                         const Tensor& dout, const Tensor& x, const ModelWeights& w,
                         const ModelWeights& g) {
  Tensor rstd = ctx.read(tag + ".rstd");
  if (!ctx.running()) return;
  Tensor d = dx, dw = g.norm_w;
  kernels::zero(d);
  kernels::rmsnorm_backward(d, dw, dout, x, w.norm_w, rstd);
}

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
      .fix_shape = fix_shape,
      .describe = describe,
      .residual_init_scale = residual_init_scale,
      .block_forward = llama_block_forward,
      .block_backward = llama_block_backward,
      .final_norm_forward = final_norm_forward,
      .final_norm_backward = final_norm_backward,
  };
  return kLlama;
}

}  // namespace memfit
