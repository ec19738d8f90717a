// A decoder-only transformer of any family (GPT-2, LLaMA): the parameter and gradient slabs,
// the activation buffers of one micro-batch, and the step (transformer_step.h) run over them.
#pragma once

#include <functional>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memfit/core/tensor.h"
#include "memfit/memory/pool.h"
#include "memfit/model/activation_plan.h"
#include "memfit/model/model_config.h"
#include "memfit/model/step_context.h"
#include "memfit/model/transformer_step.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/precision.h"
#include "memfit/model/step_plan.h"
#include "memfit/model/grad_store.h"
#include "memfit/model/unit_grads.h"
#include "memfit/model/weight_gather.h"
#include "memfit/state/element_range.h"

namespace memfit {

class Transformer {
 public:
  // Allocates the parameter slab (Category::params: the working weights the kernels read, in
  // half_dtype(precision)), the FP32 master weights (Category::master) when the precision is
  // not fp32 and master weights are kept, and the f32 gradient slab (Category::grads).
  // `master_range`: the master weights of these elements only (a ZeRO shard from stage 1 on,
  // Note [ZeRO]); the whole layout when absent. `master_in_ram` false: the master weights live
  // elsewhere (an offload file, Note [NVMe offload]); the model then has only its working
  // weights (at stage 3 its shard of them), and the caller keeps the master.
  // `sharding` (ZeRO stage 3, Note [ZeRO stage 3]): the working weights are this rank's shard
  // (`master_range`, which must be its shards entry) and the step gathers what each phase
  // reads (model/weight_gather.h). Every rank must then run the same steps and loads.
  // `grad_sharding` (ZeRO stages 2-3, or stages 0-1 reducing every micro-batch: Note [Sharded
  // gradients]): the backward writes each unit's gradients into buffers of their own and
  // reduces them over the ranks as each ends (model/unit_grads.h); grad_sums() is then the
  // accumulator of this rank's shard (whole with `grad_sharding->whole`).
  // `param_offload` (--offload-params nvme, Note [NVMe offload]): the blocks' working weights
  // live in that file (kept by the caller, outliving the model) and are read into a ring before
  // the phases that need them (WeightGather's file source); in one process RAM holds the
  // persistent units alone (Category::params), at stage 3 (with `sharding`) no working shard:
  // the file holds the rank's part of each block, read and then gathered. params() is empty.
  // Needs master_in_ram false.
  // `grad_store` (--offload-grads nvme, one process: model/grad_store.h): no gradient slab; each
  // unit's gradients live in the store's buffers while its backward runs.
  Transformer(const ModelConfig& config, MemoryPool& pool, const PrecisionOptions& precision = {},
              std::optional<ElementRange> master_range = std::nullopt, bool master_in_ram = true,
              const ParamSharding* sharding = nullptr,
              const GradSharding* grad_sharding = nullptr,
              const ParamOffload* param_offload = nullptr,
              std::unique_ptr<GradStore> grad_store = nullptr);

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  const PrecisionOptions& precision() const { return precision_; }
  // The working weights: what forward and backward read (f32, bf16 or f16), over
  // params_range(): the whole layout, or at ZeRO stage 3 this rank's shard.
  Tensor& params() { return params_; }
  ElementRange params_range() const { return sharded_ ? master_range_ : whole(); }
  bool params_sharded() const { return sharded_; }
  // --offload-params: the blocks' working weights are in a file; the update reaches them
  // through offloaded_params() (WeightGather::update_piece), init and loads through
  // set_weights, saves through offloaded_params() (WeightGather::read_range, Note [Streamed
  // save]).
  bool params_offloaded() const { return gather_ && gather_->from_file(); }
  WeightGather& offloaded_params() { return *gather_; }
  // At stage 3, after the working shard changed (the optimizer wrote it): every rank calls it
  // at the same point; the persistent units are gathered again. Nothing to do otherwise.
  void working_changed();
  // Stage 3: the bytes the gathers covered since the last call (0 otherwise).
  int64_t take_gathered_bytes() { return gather_ ? gather_->take_gathered_bytes() : 0; }
  // The weights of record: what the optimizer updates and checkpoints save and load. The FP32
  // master weights when there are any, else the working weights (fp32, or pure bf16). They
  // cover weights_range(): the whole layout unless the master weights are a shard.
  Tensor& weights() { return master_.defined() ? master_ : params_; }
  bool has_master() const { return master_.defined(); }
  ElementRange weights_range() const {
    return master_.defined() || sharded_ ? master_range_ : whole();
  }
  // Whether the weights of record are the whole layout (not a shard of master weights).
  bool whole_weights() const { return weights_range() == whole(); }
  // After the weights of record changed (optimizer step, load): the working copy = master
  // rounded to nearest even, over weights_range() (nothing to round without master weights);
  // then, at stage 3, working_changed().
  void refresh_working();
  // Sets the weights of record and the working copy from `fill`, which writes the f32 values of
  // layout elements [from, to) into dst (initial weights drawn, a checkpoint read): over
  // params_range(), in increasing order, the f32 weights of record (master weights, or f32
  // working weights without them) filled in place and the rest through one staging piece of at
  // most `piece_elements` f32 (Category::staging, "setup.piece"), rounded into the working copy
  // as refresh_working rounds the master (the same values, so the same bits). Nothing else is
  // used: no whole-layout buffer (Note [Set-up by range] in docs/notes/zero.md).
  // `offloaded_master` (master weights kept outside, master_in_ram false): called once with a
  // fill that writes master_range()'s values where the caller asks (its file's buffers, a unit
  // at a time), rounding them into the working copy on the way.
  using RangeFill = std::function<void(int64_t from, int64_t to, float* dst)>;
  using MasterSink = std::function<void(const RangeFill& fill)>;
  void set_weights(const RangeFill& fill, int64_t piece_elements,
                   const MasterSink& offloaded_master = {});
  // The master weights' range (a ZeRO shard, or the whole layout), in RAM or not.
  ElementRange master_range() const { return master_range_; }
  // The whole f32 gradient slab: what the backward accumulates into (stages 0-1; then the
  // summed gradients too). Undefined at stages 2-3 over several ranks, which hold their shard's
  // sums alone (grad_sums(), Note [Sharded gradients]).
  Tensor& grads() { return grads_; }
  // The summed gradients the update reads, over grad_sums_range(): the whole slab, or the
  // per-unit reduction's accumulator (this rank's shard at stages 2-3).
  Tensor& grad_sums() { return unit_grads_ ? unit_grads_->sums() : grads_; }
  ElementRange grad_sums_range() const { return unit_grads_ ? unit_grads_->range() : whole(); }
  // The summed gradients of `r`, a range inside grad_sums_range().
  Tensor grad_sums(ElementRange r);
  // Whether every micro-batch's backward reduces its gradients over the ranks (per unit) itself.
  UnitGrads* unit_grads() { return unit_grads_.get(); }
  // --offload-grads (model/grad_store.h): no slab; the gradients live per unit in the store.
  GradStore* grad_store() { return grad_store_.get(); }
  Tensor param(const std::string& name) const;
  // One parameter's gradient in the whole slab (a test helper; refuses at stages 2-3).
  Tensor grad(const std::string& name) const;

  // The family's initialisation: weights normal(0, 0.02), norm gains 1, biases 0, padded vocab
  // rows 0; GPT-2 also scales its residual projections (attn.c_proj, mlp.c_proj) by
  // 1/sqrt(2 n_layer), as its paper does (Hugging Face's LLaMA does not).
  // Drawn in f32 and rounded to nearest even where the weights of record are bf16, so every
  // precision starts from the same values; over this model's ranges alone (set_weights, through
  // a staging piece of at most `piece_elements`), the bits the whole draw gives them.
  void init_weights(uint64_t seed, int64_t piece_elements = kDefaultPieceElements);
  // The same values written by set_weights (offloaded master weights: `offloaded_master`).
  void init_weights(uint64_t seed, int64_t piece_elements, const MasterSink& offloaded_master);
  static constexpr int64_t kDefaultPieceElements = int64_t{1} << 20;  // 4 MiB of f32

  // Allocates the step plan for micro-batches of B x T (T <= max_seq_len) once: one arena per
  // category, every buffer a view at its planned offset (Note [Step arena]). Calling it again
  // with the same sizes does nothing, with other sizes reallocates.
  void reserve(int B, int T, const ActivationOptions& options = {});
  // Allocates and from now on executes this plan: plan_step's for this model's config and
  // precision, possibly with lifetimes changed and layout_arenas run again (tests do this).
  void reserve(StepPlan plan);
  const StepPlan& step_plan() const { return ctx_.plan(); }
  int batch() const { return B_; }
  int seq_len() const { return T_; }
  AttentionKind attention() const { return step_plan().options.attention; }
  const CheckpointPolicy& ckpt() const { return step_plan().options.ckpt; }

  // A check for tests: with it on, each buffer's bytes are overwritten with NaN (token ids with
  // 0) at the start of each micro-batch and just before and after each span of its lifetime, so
  // a read outside the lifetime the plan declares changes the results (Note [Step arena]).
  void set_poison_dead_buffers(bool on) {
    poison_ = on;
    ctx_.set_poison(on);
  }

  // Tells `observer` (null: nobody) what the running step does, phase by phase and buffer by
  // buffer (model/step_observer.h: the profiler's source); kept over reserve().
  void set_step_observer(StepObserver* observer) {
    observer_ = observer;
    ctx_.set_observer(observer);
  }

  // Mean cross-entropy of predicting targets (B,T) from tokens (B,T), both i32 in [0, vocab).
  // With `training`, also runs the LM head's backward as it goes (Note [Fused LM head]): the
  // gradient of the head is accumulated and d(norm) is kept for backward(), which must
  // follow before the next forward. The loss gradient is loss_scale/(B*T) per position
  // (loss_scale: fp16's dynamic loss scale, which the gradients then carry too).
  float forward(const Tensor& tokens, const Tensor& targets, bool training,
                float loss_scale = 1.0f);
  // Accumulates (+=) every parameter's gradient of the last training forward into grads().
  void backward();
  // The same, calling final_from(e) whenever the gradient slab's elements [e, end) are final for
  // this micro-batch: the layout puts the blocks in order between the embeddings and the final
  // norm (and an untied head), and the backward finishes them from the last, so what is final
  // is always a suffix; e = 0 at the end. Data parallelism starts summing them meanwhile.
  // With per-unit gradients every backward reduces them (final_from is not called).
  void backward(const std::function<void(int64_t final_from)>& final_from);
  void zero_grad();

  // Logits (B, T, vocab_size) of every position, for evaluation against other implementations
  // and for sampling. `logits` is f32 (B, T, vocab_size).
  void logits(const Tensor& tokens, Tensor& logits);

  // The activation and workspace buffers by tag, as allocated by reserve(). A buffer's bytes
  // may belong to another buffer outside its lifetime (step_plan().buffers).
  const Tensor& buffer(const std::string& tag) const;

  // The first tensor holding an inf or NaN, for a run that went non-finite: the weights of
  // record, then the working weights, then the activation plan's buffers that own their bytes
  // in the order the forward writes them, then the gradients in the order the backward writes
  // them ("h.3.mlp.c_fc.weight (gradient)"). Empty if everything is finite.
  std::string first_non_finite();

 private:
  ElementRange whole() const { return {0, layout_.total()}; }
  // grads_ is a view of the activations arena the running plan put it in (Note [Gradients by
  // lifetime]), not a slab of its own.
  bool grads_in_arena() const { return ctx_.running() && ctx_.plan().options.grads_in_arena; }
  // The views the step reads: of params_, or stage 3's gathered units.
  const ModelWeights& working_views() const { return gather_ ? gather_->weights() : weights_; }

  ModelConfig config_;
  MemoryPool& pool_;
  ParamLayout layout_;
  PrecisionOptions precision_;
  Tensor params_, master_, grads_;
  ElementRange master_range_;
  ModelWeights weights_, grad_views_;  // typed views of params_ and grads_
  int B_ = 0, T_ = 0;
  StepContext ctx_;  // running the step plan
  std::unique_ptr<TransformerStep> step_;
  bool poison_ = false;
  StepObserver* observer_ = nullptr;
  bool backward_ready_ = false;
  bool sharded_ = false;
  std::unique_ptr<WeightGather> gather_;  // stage 3
  std::unique_ptr<UnitGrads> unit_grads_;  // stages 2-3 (or 0-1 reducing every micro-batch)
  std::unique_ptr<GradStore> grad_store_;  // --offload-grads: the gradients per unit, no slab
  // The views the step writes gradients through.
  const ModelWeights& grad_views() const {
    return unit_grads_ ? unit_grads_->views() : grad_store_ ? grad_store_->views() : grad_views_;
  }
};

}  // namespace memfit
