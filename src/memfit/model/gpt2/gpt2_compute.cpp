// GPT-2's answers to what model/family_compute.h asks: its block and its final norm
// (LayerNorm), what the step runs.
#include <string>

#include "memfit/kernels/cpu/fill.h"
#include "memfit/kernels/cpu/layernorm.h"
#include "memfit/model/family_compute.h"
#include "memfit/model/gpt2/gpt2_block.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/step_context.h"

namespace memfit {

namespace {

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

const FamilyCompute& gpt2_compute() {
  static const FamilyCompute k{
      .block_forward = gpt2_block_forward,
      .block_backward = gpt2_block_backward,
      .final_norm_forward = final_norm_forward,
      .final_norm_backward = final_norm_backward,
  };
  return k;
}

}  // namespace memfit
