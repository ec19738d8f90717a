// Loss masks in training and evaluation (docs/data.md, "Loss masks"): on data with loss-mask
// shards (chat and instruction data) the loss of a step is the mean over the step's masked-in
// targets, all micro-batches and ranks together, as one batch of world x grad_accum x B rows
// would give: each micro-batch's forward returns its masked sum, and every masked-in target's
// gradient is seeded with loss_scale x (grad_accum x world) / M, M the step's masked-in
// targets (counted from the masks before the first micro-batch, the same on every rank), so
// that after the update divides the summed gradients by grad_accum x world (update.h) they are
// the gradient of that mean. Not the mean of the micro-batches' means: a micro-batch with more
// trained tokens weighs more. A step with no masked-in target (prepare never writes one: every
// record keeps a trained token) has loss 0 and zero gradients. Without mask shards these
// functions do what the trainer always did: Transformer::forward's mean, averaged.
#pragma once

#include <cstdint>

#include "memfit/io/data/data_loader.h"
#include "memfit/model/transformer.h"

namespace memfit {

struct StepLoss {
  bool masked = false;
  int64_t targets = 0;  // masked-in targets of the step over every rank (masked only)
  float dloss = 0;      // the gradient seeded into each masked-in target (masked only)
};

// Before micro-batches [data.position(), + micro_batches): counts their masked-in targets when
// `data` has loss masks. `divisor`: what the summed gradients are divided by afterwards
// (grad_accum x world; 1 for an evaluation).
StepLoss step_loss_begin(io::DataLoader& data, int64_t micro_batches, int64_t divisor,
                         float loss_scale);

// The forward of the loader's current batch: Transformer::forward's mean without a mask, the
// masked sum with one (seeding s.dloss when training).
float micro_batch_loss(Transformer& gpt, const io::DataLoader& data, const StepLoss& s,
                       bool training, float loss_scale = 1.0f);

// The step's (or evaluation's) loss from micro_batch_loss summed over `micro_batches`
// micro-batches of every rank: their mean without a mask, sum / targets with one (0 when there
// are none).
float step_loss_mean(double sum, const StepLoss& s, int64_t micro_batches);

}  // namespace memfit
