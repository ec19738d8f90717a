#include "memfit/train/update.h"

#include <cmath>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/residual.h"
#include "memfit/train/grad_clip.h"

namespace memfit {

UpdateOutcome apply_update(Transformer& gpt, Optimizer& optimizer, DynamicLossScaler* scaler, float lr,
                           float clip, int grad_accum) {
  return apply_update(
      gpt,
      [&](float rate, float scale) {
        if (gpt.has_master())  // the working copy rounded in the same pass (Optimizer::step_master)
          optimizer.step_master(gpt.weights(), gpt.params(), gpt.grads(), rate, scale);
        else
          optimizer.step(gpt.weights(), gpt.grads(), rate, scale);
      },
      scaler, lr, clip, grad_accum);
}

UpdateOutcome apply_update(Transformer& gpt, const std::function<void(float, float)>& step,
                           DynamicLossScaler* scaler, float lr, float clip, int grad_accum) {
  UpdateOutcome out;
  double sum_squares;
  if (scaler) {
    // Unscale before clipping, in one pass that also finds any overflow.
    const kernels::UnscaleResult r = kernels::unscale_and_check(gpt.grads(), scaler->inv_scale());
    if (scaler->update(!r.finite)) {
      out.skipped = true;
      out.grad_norm = NAN;
      return out;
    }
    sum_squares = r.sum_squares;
  } else {
    sum_squares = kernels::sum_squares(gpt.grads());
    if (!std::isfinite(sum_squares)) {
      out.non_finite = true;
      out.grad_norm = sum_squares;
      return out;
    }
  }
  out.grad_norm = std::sqrt(sum_squares) / grad_accum;
  const float scale = clip_factor(out.grad_norm, clip) / static_cast<float>(grad_accum);
  step(lr, scale);
  return out;
}

}  // namespace memfit
