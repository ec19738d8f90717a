// The end of a training step, after the backward of every micro-batch: check the gradients,
// unscale them (fp16), clip, step the optimizer on the weights of record and refresh the
// working copy. The trainer and the step benchmark both call this, so that what is measured is
// what trains. Under ZeRO (Note [ZeRO], docs/notes/zero.md) the optimizer steps this rank's
// shard and the updated working weights are all-gathered.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "memfit/dist/communicator.h"
#include "memfit/model/transformer.h"
#include "memfit/optim/unit_steps.h"
#include "memfit/optim/optimizer.h"
#include "memfit/core/element_range.h"
#include "memfit/train/loss_scaler.h"

namespace memfit {

struct UpdateOutcome {
  // fp16: the gradients overflowed and the step was skipped (weights and optimizer state
  // untouched; the scaler has backed off). Without a scaler, never set.
  bool skipped = false;
  // Without a scaler: a gradient was inf or NaN, and nothing was updated. The caller stops.
  bool non_finite = false;
  double grad_norm = 0;  // of the mean gradient over micro-batches, unscaled, before clipping
  int64_t gathered_bytes = 0;  // of working weights all-gathered from their owners (ZeRO >= 1)
};

// Several ranks (any ZeRO stage): how the summed gradients and the update are spread.
struct RankShards {
  dist::Communicator* comm = nullptr;
  // One range per rank, in rank order, tiling the layout (shard_ranges). The gradient norm is
  // the sum of the shards' sums of squares added in rank order at every stage, so stages 0-2
  // clip with the same bits (Note [Deterministic reduction]).
  std::vector<ElementRange> ranges;
  // Every rank holds every summed gradient (stages 0 and 1: all-reduced); else only its own
  // shard's (stages 2-3: reduce-scattered per unit, Note [Sharded gradients]), and the ranks
  // all-gather their shards' sums of squares and overflow flags.
  bool grads_whole = true;
};

// The summed gradients (Transformer::grad_sums: the whole layout, or this rank's shard at stages
// 2-3) hold the sum over `grad_accum` micro-batches (times the loss scale, with a scaler);
// their mean's norm decides the clipping factor (clip <= 0: off). The optimizer steps its
// range(): the whole layout, or (ZeRO stage >= 1, `shards` given) this rank's shard, after
// which the working weights are all-gathered from their owners.
// `pipeline` (--pp, Note [Pipeline parallel]): this rank's pipeline group; the gradient norm
// is then every stage's, each stage's parts gathered and added in stage order (one process's
// sum bit for bit without data ranks), so every stage clips by the same factor and agrees on
// an overflow.
UpdateOutcome apply_update(Transformer& gpt, Optimizer& optimizer, DynamicLossScaler* scaler,
                           float lr, float clip, int grad_accum,
                           const RankShards* shards = nullptr,
                           dist::Communicator* pipeline = nullptr);
// After this rank's optimizer step, what every rank's working weights need: at ZeRO stage 3
// (the working weights are the shard itself) the persistent units gathered again
// (Transformer::working_changed; the model counts those bytes); with `shards` given (this rank
// updated its shard, shards->ranges[rank], of whole working weights: stages 1-2) every rank's
// shard from its owner, in place in gpt.params(); else nothing. Returns the bytes that
// all-gather covered (the log's comm_bytes.all_gather).
int64_t publish_working_weights(Transformer& gpt, const RankShards* shards);
// The same with the optimizer step as `step(lr, grad_scale)`: for an optimizer that is not one
// Optimizer over the model's slabs (one streamed from offload files, offload/). The gradient
// check and clipping are the same (over `shards` when given); a `step` that updates a shard
// publishes the working weights itself (publish_working_weights).
UpdateOutcome apply_update(Transformer& gpt, const std::function<void(float lr, float scale)>& step,
                           DynamicLossScaler* scaler, float lr, float clip, int grad_accum,
                           const RankShards* shards = nullptr,
                           dist::Communicator* pipeline = nullptr);

// --pp-schedule interleaved (Note [Pipeline parallel], "Interleaved"): a rank's V chunk models,
// chunk c being virtual stage c x P + stage, each with its optimizer and (over data ranks) its
// shards. The gradient norm adds every virtual stage's parts in virtual-stage order (each
// chunk's parts gathered over `pipeline` in stage order, chunk by chunk), the whole layout's
// units in order: one process's sum bit for bit without data ranks. Every chunk's optimizer then
// steps by the same factor.
struct ChunkUpdate {
  Transformer* gpt = nullptr;
  Optimizer* optimizer = nullptr;
  const RankShards* shards = nullptr;
  // Instead of `optimizer`: the step as `step(lr, grad_scale)` (one streamed from offload
  // files), which publishes the working weights itself and returns the bytes gathered.
  std::function<int64_t(float lr, float scale)> step;
};
UpdateOutcome apply_update_chunks(const std::vector<ChunkUpdate>& chunks,
                                  DynamicLossScaler* scaler, float lr, float clip,
                                  int grad_accum, dist::Communicator& pipeline);

// --update-in-backward (Note [Update in backward]): the step's updates already ran in the
// backward (optim/backward_update.h); the outcome the log and the non-finite stop read.
// grad_norm is the sqrt of the sum of the units' squared norms (before any per-unit clipping),
// the ordinary step's norm bit for bit; a non-finite unit was left unstepped and stops the run.
UpdateOutcome backward_update_outcome(const BackwardUpdateResult& result);
// --update-in-backward under --tp (Note [Update in backward], "Under --tp"): `steps` sums each
// unit's partial gradients over gpt's tensor group before its step (the replicated key/value
// heads', --sp's norms'), and adds the norm as the ordinary step's tensor check does; the
// parts' optimizers take the group where `optim` (OptimConfig::name) groups elements across the
// slices (Adam-mini, 4-bit AdamW: optim/tensor_split.h). Nothing without a tensor group of 2
// or more. Once the model's tensor group is set.
void split_unit_steps(Transformer& gpt, UnitSteps& steps, const std::string& optim);

}  // namespace memfit
