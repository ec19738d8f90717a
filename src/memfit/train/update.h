// The end of a training step, after the backward of every micro-batch: check the gradients,
// unscale them (fp16), clip, step the optimizer on the weights of record and refresh the
// working copy. The trainer and the step benchmark both call this, so that what is measured is
// what trains.
#pragma once

#include <functional>

#include "memfit/model/transformer.h"
#include "memfit/optim/optimizer.h"
#include "memfit/train/loss_scaler.h"

namespace memfit {

struct UpdateOutcome {
  // fp16: the gradients overflowed and the step was skipped (weights and optimizer state
  // untouched; the scaler has backed off). Without a scaler, never set.
  bool skipped = false;
  // Without a scaler: a gradient was inf or NaN, and nothing was updated. The caller stops.
  bool non_finite = false;
  double grad_norm = 0;  // of the mean gradient over micro-batches, unscaled, before clipping
};

// Gradients hold the sum over `grad_accum` micro-batches (times the loss scale, with a scaler);
// their mean's norm decides the clipping factor (clip <= 0: off).
UpdateOutcome apply_update(Transformer& gpt, Optimizer& optimizer, DynamicLossScaler* scaler, float lr,
                           float clip, int grad_accum);
// The same with the optimizer step as `step(lr, grad_scale)`: for an optimizer that is not one
// Optimizer over the model's slabs (one streamed from offload files, offload/).
UpdateOutcome apply_update(Transformer& gpt, const std::function<void(float lr, float scale)>& step,
                           DynamicLossScaler* scaler, float lr, float clip, int grad_accum);

}  // namespace memfit
