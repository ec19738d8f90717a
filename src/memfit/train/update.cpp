#include "memfit/train/update.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <span>
#include <vector>

#include "memfit/dist/gather_vectors.h"
#include "memfit/dist/shard_collectives.h"
#include "memfit/dist/zero/fp8_publish.h"
#include "memfit/kernels/cpu/bf16_check.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/residual.h"
#include "memfit/model/sequence_parallel.h"
#include "memfit/model/stage_offsets.h"
#include "memfit/model/tensor_partial_sums.h"
#include "memfit/model/tensor_slices.h"
#include "memfit/optim/tensor_split.h"
#include "memfit/state/shard.h"
#include "memfit/train/grad_clip.h"

namespace memfit {

namespace {

// What the update needs of a range of summed gradients: whether they are finite, and their
// sum of squares (unscaled first, in place, with a scaler).
struct GradCheck {
  double finite = 1;  // 1 or 0: a double, so the ranks' checks gather as one array
  double sum_squares = 0;
  // --tp: sum_squares is then this rank's share of the split parameters' squares alone, and
  // `replicated` the squares of the parameters every tensor rank holds whole (the same on each);
  // tensor_check adds the first over the group and the second once.
  double replicated = 0;
};

// bf16 sums (--grad-dtype bf16): kernels/cpu/bf16_check.h, the check the offloaded gradients
// take per unit too.
GradCheck check_bf16(Tensor& g, DynamicLossScaler* scaler) {
  const kernels::UnscaleResult r = kernels::unscale_and_check_bf16(
      static_cast<uint16_t*>(g.raw_data()), g.numel(),
      scaler ? std::optional<float>(scaler->inv_scale()) : std::nullopt);
  return {r.finite ? 1.0 : 0.0, r.sum_squares};
}

// One source of truth for the global norm's order: a range's check is its parts in each unit
// (unit_ranges in model/param_layout.h: the embeddings, each block, the tail) added in unit
// order, so the gradients offloaded per unit (--offload-grads: each unit checked as its last
// backward ends, offload/offloaded_grads.cpp) give the same bits as the slab in RAM.
GradCheck check_part(Tensor g, DynamicLossScaler* scaler) {
  if (g.dtype() == DType::bf16) return check_bf16(g, scaler);
  if (scaler) {
    const kernels::UnscaleResult u = kernels::unscale_and_check(g, scaler->inv_scale());
    return {u.finite ? 1.0 : 0.0, u.sum_squares};
  }
  const double s = kernels::sum_squares(g);
  return {std::isfinite(s) ? 1.0 : 0.0, s};
}

// --tp (Note [Tensor parallel]): how much of a parameter's squares a rank adds to the tensor
// group's sum: 1 for its slice of a split parameter, 1/R for a key/value head replicated on R
// ranks (GQA above n_kv_head), and 0 for a parameter every rank holds whole (the norms, positions,
// row-parallel biases), whose squares are counted once, beside the sum.
std::vector<double> tensor_weights(const Transformer& gpt) {
  const ParamLayout whole(whole_model(gpt.config()));
  const int R = gpt.config().kv_replicas();
  std::vector<double> w;
  for (size_t i = 0; i < gpt.layout().params().size(); ++i) {
    const ParamInfo& p = gpt.layout().params()[i];
    const bool kv = p.role == ParamRole::attn_k_weight || p.role == ParamRole::attn_v_weight;
    w.push_back(p.shape == whole.params()[i].shape ? 0.0 : kv ? 1.0 / R : 1.0);
  }
  return w;
}

// A range's check under --tp: each parameter's part on its own, split from replicated (a
// ZeRO shard holds parts of both). In unit order, as check_grads.
GradCheck check_tensor_slices(Transformer& gpt, const ElementRange& r,
                              DynamicLossScaler* scaler) {
  const std::vector<double> weights = tensor_weights(gpt);
  GradCheck all;
  for (size_t i = 0; i < gpt.layout().params().size(); ++i) {
    const ParamInfo& p = gpt.layout().params()[i];
    const ElementRange part = r.intersect({p.offset, p.offset + p.numel});
    if (part.empty()) continue;
    const GradCheck c = check_part(gpt.grad_sums(part), scaler);
    all.finite = std::min(all.finite, c.finite);
    if (weights[i] == 0.0)
      all.replicated += c.sum_squares;
    else
      all.sum_squares += weights[i] * c.sum_squares;
  }
  return all;
}

// --tp above 1: the model's own weights, or LoRA's adapters, are split over the group.
bool tensor_split(const Transformer& gpt) {
  return gpt.tensor_group() != nullptr && gpt.tensor_group()->size() > 1;
}

// LoRA's adapters (Note [LoRA]): their gradients are the step's, summed over the data ranks
// whole, so every rank computes the same norm from them. One part a block, in block order, so a
// pipeline's stages add to one process's sum bit for bit (pipeline_check). Under --tp each
// matrix apart: the split ones' squares (column-parallel B, row-parallel A) the rank's share,
// the ones every rank holds whole (LoraLayout::replicated_ranges, summed over the group
// already) in `replicated`.
std::vector<GradCheck> lora_checks(Transformer& gpt, DynamicLossScaler* scaler) {
  const LoraLayout& lora = *gpt.lora();
  const std::vector<ElementRange> whole = lora.replicated_ranges();
  const int64_t r = lora.options().rank;
  std::vector<GradCheck> parts;
  int layer = -1;
  for (const LoraParam& p : lora.params()) {
    if (parts.empty() || p.layer != layer) parts.emplace_back();
    layer = p.layer;
    GradCheck& part = parts.back();
    for (const ElementRange m : {ElementRange{p.a_offset, p.a_offset + r * p.in},
                                 ElementRange{p.b_offset, p.b_offset + p.out * r}}) {
      const GradCheck c = check_part(gpt.lora_grads().view(m.begin, {m.size()}), scaler);
      part.finite = std::min(part.finite, c.finite);
      const bool replicated = std::find(whole.begin(), whole.end(), m) != whole.end();
      (replicated ? part.replicated : part.sum_squares) += c.sum_squares;
    }
  }
  return parts;
}

// Parts added in order: the overflow flags' minimum, the sums of squares' sum from 0.
GradCheck add_checks(const std::vector<GradCheck>& parts) {
  GradCheck all;
  for (const GradCheck& p : parts) {
    all.finite = std::min(all.finite, p.finite);
    all.sum_squares += p.sum_squares;
    all.replicated += p.replicated;
  }
  return all;
}

// A range's checks, unit by unit in unit order (what check_grads adds); under --tp one part,
// split from replicated (check_tensor_slices).
std::vector<GradCheck> unit_checks(Transformer& gpt, const ElementRange& r,
                                   DynamicLossScaler* scaler) {
  std::vector<GradCheck> parts;
  if (r.empty()) return parts;
  // --pp with tied embeddings: the last stage's copy of the token table (its layout's last
  // unit) holds the table's summed gradient, which the first stage counts (the tensor counted
  // once): unscaled and checked, its squares not added (Note [Pipeline parallel], "Tied
  // embeddings").
  const ElementRange copy = tied_table_copy(gpt.layout());
  if (tensor_split(gpt)) {
    const ElementRange in_copy = r.intersect(copy);
    if (in_copy.empty()) return {check_tensor_slices(gpt, r, scaler)};
    if (const ElementRange before = r.intersect({0, copy.begin}); !before.empty())
      parts.push_back(check_tensor_slices(gpt, before, scaler));
    GradCheck c = check_part(gpt.grad_sums(in_copy), scaler);
    c.sum_squares = c.replicated = 0;
    parts.push_back(c);
    return parts;
  }
  if (GradStore* store = gpt.grad_store()) {
    // Taken by the last backward, unit by unit (the whole layout: one process).
    for (const UnitGradCheck& c : store->unit_checks())
      parts.push_back({c.finite ? 1.0 : 0.0, c.sum_squares});
    return parts;
  }
  for (const ElementRange& u : unit_ranges(gpt.layout())) {
    const ElementRange part = r.intersect(u);
    if (part.empty()) continue;
    GradCheck c = check_part(gpt.grad_sums(part), scaler);
    if (!copy.empty() && copy.contains(part)) c.sum_squares = 0;
    parts.push_back(c);
  }
  return parts;
}

GradCheck check_grads(Transformer& gpt, const ElementRange& r, DynamicLossScaler* scaler) {
  return add_checks(unit_checks(gpt, r, scaler));
}

// The whole step's check as the parts it adds, in order: one range's units, or every rank's
// shard in rank order (computed here when the summed gradients are whole, else each rank's
// own, gathered).
std::vector<GradCheck> step_parts(Transformer& gpt, DynamicLossScaler* scaler,
                                  const RankShards* shards) {
  if (gpt.lora()) return lora_checks(gpt, scaler);
  if (!shards) return unit_checks(gpt, {0, gpt.layout().total()}, scaler);
  const size_t W = shards->ranges.size();
  std::vector<GradCheck> parts(W);
  if (shards->grads_whole) {
    for (size_t r = 0; r < W; ++r) parts[r] = check_grads(gpt, shards->ranges[r], scaler);
  } else {
    const size_t me = static_cast<size_t>(shards->comm->rank());
    parts[me] = check_grads(gpt, shards->ranges[me], scaler);
    const std::vector<int64_t> ones(W, 1);
    shards->comm->all_gather(&parts[me], parts.data(), ones, sizeof(GradCheck));
  }
  return parts;
}

// --pp (Note [Pipeline parallel], "Clipping"): every stage's parts gathered over the pipeline
// group and added in stage order. A stage's parts in one process are its units, and the stages'
// units in stage order are the whole layout's units in order, so the sum is one process's sum
// bit for bit; over data ranks each stage's parts are its ranks' shards (deterministic, the
// same on every rank, not the data-parallel run's order).
std::vector<GradCheck> gather_parts(dist::Communicator& pipe, const std::vector<GradCheck>& mine) {
  return dist::all_gather_vectors(pipe, mine);
}

GradCheck pipeline_check(dist::Communicator& pipe, const std::vector<GradCheck>& mine) {
  return add_checks(gather_parts(pipe, mine));
}

// --tp (Note [Tensor parallel]): a rank's gradients are its slices of the split parameters
// and whole copies of the replicated ones (norms, positions, the row-parallel biases: the same
// on every tensor rank). The whole model's sum of squares: the split parts' summed over the
// tensor group (`mine.sum_squares`, over the data group's shards already), the replicated ones'
// once (`mine.replicated`). The finite flags agree over the group too.
GradCheck tensor_check(Transformer& gpt, const GradCheck& mine) {
  if (!tensor_split(gpt)) return mine;
  double v[2] = {mine.sum_squares, mine.finite > 0 ? 0.0 : 1.0};
  gpt.tensor_group()->all_reduce_sum(std::span<double>(v, 2));
  return {v[1] > 0 ? 0.0 : 1.0, v[0] + mine.replicated, 0.0};
}

// From the step's check: skip (fp16 overflow) or stop (non-finite) into `out`, returning false;
// else the norm into `out`, the gradients' factor (clipping, the mean) into `scale`, true.
bool decide_step(const GradCheck& check, DynamicLossScaler* scaler, float clip, int grad_accum,
                 UpdateOutcome& out, float& scale) {
  if (scaler) {
    if (scaler->update(check.finite == 0)) {
      out.skipped = true;
      out.grad_norm = NAN;
      return false;
    }
  } else if (check.finite == 0 || !std::isfinite(check.sum_squares)) {
    out.non_finite = true;
    out.grad_norm = check.sum_squares;
    return false;
  }
  out.grad_norm = std::sqrt(check.sum_squares) / grad_accum;
  scale = clip_factor(out.grad_norm, clip) / static_cast<float>(grad_accum);
  return true;
}

// The optimizer's step of `gpt`'s range, the working copy refreshed and (from a shard)
// published; returns the bytes the publish gathered.
int64_t step_optimizer(Transformer& gpt, Optimizer& optimizer, const RankShards* shards,
                       float rate, float scale) {
  if (gpt.lora()) {  // the adapters alone, f32 (Note [LoRA]): the optimizer is over them
    optimizer.step(gpt.lora_weights(), gpt.lora_grads(), rate, scale);
    return 0;
  }
  // The optimizer's range of every slab: the whole layout, or this rank's shard (the master
  // weights are then that shard alone).
  const ElementRange r = optimizer.range();
  const bool whole = r == ElementRange{0, gpt.layout().total()};
  Tensor grads = gpt.grad_sums(r);
  Tensor weights = gpt.whole_weights() && !whole ? gpt.weights().view(r.begin, {r.size()})
                                                 : gpt.weights();
  if (gpt.fp8_weights()) {
    // Stored FP8 weights (Note [FP8], "Storage"): the master weights stepped, then the
    // working copy rounded and the linears encoded from them; from a shard (stages 1-2) by
    // the publish below, with the scales the ranks agree on.
    optimizer.step(weights, grads, rate, scale);
    if (gpt.whole_weights()) gpt.refresh_working();
  } else if (gpt.has_master()) {  // the working copy rounded in the same pass (step_master)
    // Stage 3's working weights are the shard itself (Note [ZeRO stage 3]).
    Tensor working = whole || gpt.params_sharded() ? gpt.params()
                                                   : gpt.params().view(r.begin, {r.size()});
    optimizer.step_master(weights, working, grads, rate, scale);
  } else {
    optimizer.step(weights, grads, rate, scale);
  }
  return publish_working_weights(gpt, whole ? nullptr : shards);
}

}  // namespace

UpdateOutcome apply_update_chunks(const std::vector<ChunkUpdate>& chunks,
                                  DynamicLossScaler* scaler, float lr, float clip,
                                  int grad_accum, dist::Communicator& pipeline) {
  std::vector<GradCheck> all;  // virtual stage by virtual stage: chunk 0 of every stage, ...
  for (const ChunkUpdate& c : chunks) {
    c.gpt->reduce_kv_replicas();        // as apply_update does, per chunk
    c.gpt->reduce_lora_partials();
    c.gpt->reduce_sequence_partials();
    const std::vector<GradCheck> parts =
        gather_parts(pipeline, step_parts(*c.gpt, scaler, c.shards));
    all.insert(all.end(), parts.begin(), parts.end());
  }
  UpdateOutcome out;
  float scale = 0;
  // --tp: the split parts' squares over the tensor group, the replicated ones once.
  const GradCheck check = tensor_check(*chunks.front().gpt, add_checks(all));
  if (!decide_step(check, scaler, clip, grad_accum, out, scale)) return out;
  for (const ChunkUpdate& c : chunks)
    out.gathered_bytes +=
        c.optimizer ? step_optimizer(*c.gpt, *c.optimizer, c.shards, lr, scale) : c.step(lr, scale);
  return out;
}

UpdateOutcome apply_update(Transformer& gpt, const std::function<void(float, float)>& step,
                           DynamicLossScaler* scaler, float lr, float clip, int grad_accum,
                           const RankShards* shards, dist::Communicator* pipeline) {
  UpdateOutcome out;
  // Unscale before clipping, in one pass that also finds any overflow; every rank reaches the
  // same decision from the same sums.
  gpt.reduce_kv_replicas();  // --tp above n_kv_head: each head's gradient whole on its replicas
  gpt.reduce_lora_partials();  // --tp: the adapters' matrices every tensor rank holds whole
  gpt.reduce_sequence_partials();  // --sp: the norms' gradients whole on every tensor rank
  const std::vector<GradCheck> parts = step_parts(gpt, scaler, shards);
  const GradCheck check = tensor_check(
      gpt, pipeline && pipeline->size() > 1 ? pipeline_check(*pipeline, parts) : add_checks(parts));
  float scale = 0;
  if (decide_step(check, scaler, clip, grad_accum, out, scale)) step(lr, scale);
  return out;
}

int64_t publish_working_weights(Transformer& gpt, const RankShards* shards) {
  if (gpt.params_sharded()) {
    // Stage 3: no all-gather of the whole; the blocks are gathered as the next step needs them.
    gpt.working_changed();
    return 0;
  }
  if (!shards) return 0;
  // Stored FP8 weights (Note [FP8], "Storage"): each owner encodes its range with the scales
  // the ranks agree on, and the codes are gathered (dist/zero/fp8_publish.h).
  if (gpt.fp8_weights()) return publish_fp8_weights(gpt, *shards->comm, shards->ranges);
  // Every rank's updated working weights, from their owners, in place.
  const ElementRange& r = shards->ranges.at(static_cast<size_t>(shards->comm->rank()));
  Tensor& params = gpt.params();
  const size_t elem = dtype_size(params.dtype());
  char* data = static_cast<char*>(params.raw_data());
  dist::all_gather_shards(*shards->comm, shards->ranges,
                          data + static_cast<size_t>(r.begin) * elem, data, elem);
  return params.numel() * static_cast<int64_t>(elem);
}

UpdateOutcome apply_update(Transformer& gpt, Optimizer& optimizer, DynamicLossScaler* scaler,
                           float lr, float clip, int grad_accum, const RankShards* shards,
                           dist::Communicator* pipeline) {
  int64_t gathered = 0;
  auto step = [&](float rate, float scale) {
    gathered = step_optimizer(gpt, optimizer, shards, rate, scale);
  };
  UpdateOutcome out = apply_update(gpt, step, scaler, lr, clip, grad_accum, shards, pipeline);
  out.gathered_bytes = gathered;
  return out;
}

UpdateOutcome backward_update_outcome(const BackwardUpdateResult& result) {
  UpdateOutcome out;
  // As apply_update: a non-finite check reports the sum of squares itself.
  if (!result.finite || !std::isfinite(result.sum_squares)) {
    out.non_finite = true;
    out.grad_norm = result.sum_squares;
    return out;
  }
  out.grad_norm = std::sqrt(result.sum_squares) / result.mean_over;
  return out;
}

void split_unit_steps(Transformer& gpt, UnitSteps& steps, const std::string& optim) {
  if (!tensor_split(gpt)) return;
  UnitSteps::TensorSplit split;
  split.weights = tensor_weights(gpt);
  // The sums Transformer::reduce_kv_replicas and reduce_sequence_partials take once a step,
  // over the unit's part alone (its f32 buffer: the fused update's gradients are f32).
  split.sum_partials = [&gpt](ElementRange part, const Tensor& grads) {
    TensorGroup& group = *gpt.tensor_group();
    sum_kv_replicas(group, gpt.config(), gpt.layout(), grads, part);
    if (sequence_parallel(gpt.config(), gpt.step_plan().options))
      sum_sequence_partials(group, gpt.layout(), grads, part);
  };
  split.all_reduce = [&gpt](std::span<double> v) { gpt.tensor_group()->all_reduce_sum(v); };
  if (takes_tensor_split(optim)) split.optimizer = {gpt.tensor_group(), slice_axes(gpt.config())};
  steps.set_tensor_split(std::move(split));
}

}  // namespace memfit
