// LLaMA's answers to what model/family_compute.h asks: its block and its final norm
// (RMSNorm), what the step runs.
#include <string>

#include "memfit/kernels/cpu/fill.h"
#include "memfit/kernels/cpu/rmsnorm.h"
#include "memfit/model/family_compute.h"
#include "memfit/model/llama/llama_block.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/step_context.h"

namespace memfit {

namespace {

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

const FamilyCompute& llama_compute() {
  static const FamilyCompute k{
      .block_forward = llama_block_forward,
      .block_backward = llama_block_backward,
      .final_norm_forward = final_norm_forward,
      .final_norm_backward = final_norm_backward,
  };
  return k;
}

}  // namespace memfit
