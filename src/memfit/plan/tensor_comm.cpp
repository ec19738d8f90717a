// The tensor group's collectives per step and their price; see tensor_comm.h.
#include "memfit/plan/tensor_comm.h"

#include "memfit/dist/comm_volume.h"
#include "memfit/model/activation_plan.h"
#include "memfit/model/fp8_weights.h"
#include "memfit/model/lora.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/precision.h"
#include "memfit/model/sequence_parallel.h"
#include "memfit/optim/tensor_split.h"
#include "memfit/state/state_placement.h"

namespace memfit {

namespace {

// The summed gradients a data rank holds once its data group has reduced them (what
// Transformer::grad_sums_range is in the run): the whole layout, or its shard at ZeRO 2-3.
ElementRange summed_range(const RunSpec& spec, const ParamLayout& layout, int data_rank) {
  const StatePlacement placement(layout, spec.optim, spec.state_options(),
                                 {data_rank, spec.world});
  return placement.grads().range;
}

// LoRA (Note [LoRA], "Under --tp"): each adapted row-parallel layer's x A^T (rows x r f32)
// summed over the group before B, in every forward (`forwards` a micro-batch) and recomputed
// block; once a step each adapter matrix every tensor rank holds whole, its gradient summed
// (Transformer::reduce_lora_partials: one all-reduce each).
void add_lora_comm(TensorCommVolume& v, const RunSpec& spec, const StepPlan& step,
                   int64_t forwards) {
  const LoraLayout lora(spec.model, spec.lora);
  if (lora.params().empty()) return;
  int64_t per_block = 0;
  for (const LoraParam& p : lora.params())
    if (p.layer == lora.params().front().layer &&
        (p.slot == LinearSlot::attn_out || p.slot == LinearSlot::mlp_out))
      ++per_block;
  int64_t blocks = 0;
  for (const Phase& p : step.phases)
    blocks += p.kind == PhaseKind::forward ? forwards : p.kind == PhaseKind::recompute ? 1 : 0;
  const int64_t sums = spec.micro_batch_passes() * blocks * per_block;
  v.all_reduce_count += sums;
  v.all_reduce_bytes +=
      sums * int64_t{spec.batch} * spec.T * spec.lora.rank * int64_t{sizeof(float)};
  for (const ElementRange& r : lora.replicated_ranges()) {
    ++v.all_reduce_count;  // (a collective cut into the group's chunks counts once)
    v.all_reduce_bytes += r.size() * int64_t{sizeof(float)};
  }
}

}  // namespace

TensorCommVolume tensor_comm_per_step(const RunSpec& spec, const StepPlan& step, int data_rank) {
  TensorCommVolume v;
  if (spec.model.tp <= 1) return v;
  const int64_t N = int64_t{spec.batch} * spec.T;
  const int64_t whole = N * spec.model.d_model * int64_t{sizeof(float)};
  // A pipeline stage (Note [Pipeline parallel], "Stages of tensor groups"): the embedding's
  // collectives on the first stage alone, the LM head's and the loss's on the last; a stage
  // before the last runs each micro-batch's forward twice (to send its output, then again from
  // the kept input before the backward), so its forward collectives count twice.
  const PipelineStage& stage = spec.model.stage;
  const bool pipelined = spec.model.pipelined();
  const bool embeds = !pipelined || stage.has_embeddings(), head = !pipelined || stage.has_head();
  const int64_t forwards = head ? 1 : 2;
  // The embedding's lookup (each forward), the LM head's d(norm).
  int64_t reduces = (embeds ? forwards : 0) + (head ? 1 : 0);
  // --sp: the final norm's output and the blocks' gathers move the step's matmul operands (the
  // norms' outputs, the half copy of d(residual): bf16 rows in bf16), the embedding's d(output)
  // f32 rows.
  int64_t gathers = head ? 1 : 0;
  for (const Phase& p : step.phases) {
    const int64_t times = p.kind == PhaseKind::forward ? forwards : 1;
    if (p.kind == PhaseKind::forward || p.kind == PhaseKind::recompute ||
        p.kind == PhaseKind::backward)
      reduces += 2 * times;
    gathers += times * (p.kind == PhaseKind::backward                                        ? 4
                        : p.kind == PhaseKind::forward || p.kind == PhaseKind::recompute ? 2
                                                                                           : 0);
  }
  const int64_t passes = spec.micro_batch_passes();
  if (sequence_parallel(spec.model, spec.activation_options())) {
    v.reduce_scatter_count = reduces * passes;
    v.reduce_scatter_bytes = v.reduce_scatter_count * whole;
    const int64_t operand = int64_t(dtype_size(half_dtype(spec.precision.precision)));
    // (LoRA's frozen base: no embedding backward, so no d(output) gathered for it.)
    const bool embedding_backward = embeds && !spec.lora.enabled();
    v.gathered_bytes = passes * (gathers * (whole / spec.model.tp / 4 * operand) +
                                 (embedding_backward ? whole / spec.model.tp : 0));
    // The norms' gradients: the part of each the data rank's summed gradients hold (the whole
    // slab, or its shard at ZeRO 2-3), one all-reduce of f32 where it holds any.
    // With --update-in-backward each unit's part of them as the unit's backward ends, in
    // each backward pass (global clipping: two).
    const ParamLayout layout(spec.model);  // named: a temporary's params() would dangle
    const ElementRange sums = summed_range(spec, layout, data_rank);
    for (const ParamInfo& p : layout.params()) {
      const int64_t n = sums.intersect({p.offset, p.offset + p.numel}).size();
      // (LoRA's frozen base has no norm gradients to sum.)
      if (sequence_partial(p.role) && n > 0 && !spec.lora.enabled()) {
        v.all_reduce_count += spec.backward_passes();
        v.all_reduce_bytes += spec.backward_passes() * n * int64_t{sizeof(float)};
      }
    }
  } else {
    v.all_reduce_count = reduces * passes;
    v.all_reduce_bytes = v.all_reduce_count * whole;
  }
  // --precision fp8: each cast's amax maxed over the group (BlockStep::fp8_cast), a float a
  // cast: a block's forward casts each linear's input and weight (8), its backward each one's
  // d(output), weight and input again (12). Where the weights are stored as codes (Note [FP8],
  // "Storage": StatePlacement::params_fp8) the step decodes them instead of casting (4 and 8),
  // and the update agrees on every stored matrix's scale once (a float a matrix: Transformer::
  // refresh_working, or the publish at ZeRO 1-2).
  if (spec.precision.precision == Precision::fp8) {
    const ParamLayout layout(spec.model);
    const bool stored = StatePlacement(layout, spec.optim, spec.state_options(),
                                       {data_rank, spec.world})
                            .params_fp8();
    const int64_t forward = stored ? 4 : 8, backward = stored ? 8 : 12;
    int64_t casts = 0;
    for (const Phase& p : step.phases)
      casts += p.kind == PhaseKind::backward ? backward
               : p.kind == PhaseKind::forward ? forward * forwards
               : p.kind == PhaseKind::recompute ? forward
                                                : 0;
    v.gathered_bytes += passes * casts * int64_t{sizeof(float)};
    if (stored)
      v.gathered_bytes +=
          static_cast<int64_t>(Fp8WeightLayout(layout).matrices().size() * sizeof(float));
  }
  if (spec.lora.enabled()) add_lora_comm(v, spec, step, forwards);
  // Every chunk's statistics: a float and two doubles a row, so the whole batch's rows once.
  v.gathered_bytes += (head ? passes * N * int64_t{sizeof(float) + 2 * sizeof(double)} : 0) +
                      2 * int64_t{sizeof(double)};
  // Replicated key/value heads (GQA, tp above n_kv_head): their weights' gradients gathered
  // once a step, k and v of every block (Transformer::reduce_kv_replicas).
  // At ZeRO 2-3 the data rank holds its shard's sums alone: its part of them.
  // --update-in-backward: each unit's part as its backward ends, in each backward pass.
  if (spec.model.kv_replicas() > 1) {
    const ParamLayout layout(spec.model);
    const ElementRange sums = summed_range(spec, layout, data_rank);
    for (const ParamInfo& p : layout.params())
      if (p.role == ParamRole::attn_k_weight || p.role == ParamRole::attn_v_weight)
        v.gathered_bytes += spec.backward_passes() *
                            sums.intersect({p.offset, p.offset + p.numel}).size() *
                            int64_t{sizeof(float)};
  }
  // --update-in-backward --clip-mode unit: each unit whose part the data rank holds clipped by
  // the whole unit's norm, its slices' squares summed over the group (two doubles, gathered;
  // UnitSteps::unit_done). Without clipping, with an optimizer that takes the group (Adam-mini,
  // 4-bit AdamW), the same pair agrees each unit's finite flag before its step.
  if (spec.update_in_backward &&
      (spec.clip > 0 ? spec.clip_mode == UnitSteps::Clip::unit
                     : takes_tensor_split(spec.optim.name))) {
    const ParamLayout layout(spec.model);
    const ElementRange sums = summed_range(spec, layout, data_rank);
    for (const ElementRange& u : unit_ranges(layout))
      if (!sums.intersect(u).empty()) v.gathered_bytes += 2 * int64_t{sizeof(double)};
  }
  // The update's (optim/tensor_split.h): Adam-mini's row-parallel rows' sums of squares, 4-bit
  // AdamW's rank-1 maxima, over the range the data rank steps (its shard at ZeRO 1-3).
  if (takes_tensor_split(spec.optim.name)) {
    const ParamLayout layout(spec.model);
    const StatePlacement placement(layout, spec.optim, spec.state_options(),
                                   {data_rank, spec.world});
    v.gathered_bytes +=
        tensor_split_gathered_bytes(spec.optim, spec.model, placement.optimizer().range);
  }
  return v;
}

double tensor_comm_seconds(const TensorCommVolume& v, int tp, const Calibration& rates,
                           const Link& link) {
  if (tp <= 1) return 0;
  // One all-reduce of all_reduce_each() bytes, as the data group's ring prices it: a rank
  // sends half what it copies.
  dist::CommVolume one;
  one.all_reduce = v.all_reduce_each();
  const double each = link_seconds(link, one.copied_bytes(tp) / 2, 2.0 * (tp - 1), rates) +
                      one.summed_bytes(tp) / rates.stream_bytes_per_s;
  // The gathers: each rank's part sent to, and received from, the tp - 1 others.
  dist::CommVolume gathers;
  gathers.all_gather = v.gathered_bytes * tp;
  // --sp's reduce-scatters: the first half of an all-reduce each (Note [Sequence parallel]).
  dist::CommVolume scatters;
  scatters.reduce_scatter = v.reduce_scatter_bytes;
  return double(v.all_reduce_count) * each +
         link_seconds(link, gathers.copied_bytes(tp) / 2, 0, rates) +
         link_seconds(link, scatters.copied_bytes(tp) / 2,
                      double(v.reduce_scatter_count) * (tp - 1), rates) +
         scatters.summed_bytes(tp) / rates.stream_bytes_per_s;
}

}  // namespace memfit
