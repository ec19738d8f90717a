// A decoder-only transformer of any family (GPT-2, LLaMA): the parameter and gradient slabs,
// the activation buffers of one micro-batch, and the step (transformer_step.h) run over them.
#pragma once

#include <functional>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/memory/pool.h"
#include "memfit/model/activation_plan.h"
#include "memfit/model/model_config.h"
#include "memfit/model/step_context.h"
#include "memfit/model/transformer_step.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/precision.h"
#include "memfit/model/step_plan.h"
#include "memfit/model/grad_store.h"
#include "memfit/model/lora.h"
#include "memfit/model/fp8_weights.h"
#include "memfit/model/quant_base.h"
#include "memfit/model/weight_source.h"
#include "memfit/core/element_range.h"

namespace memfit {

class Transformer {
 public:
  // Allocates the parameter slab (Category::params: the working weights the kernels read, in
  // half_dtype(precision)), the FP32 master weights (Category::master) when the precision is
  // not fp32 and master weights are kept, and the f32 gradient slab (Category::grads).
  // `state` (model/weight_source.h; Note [State placement]): where the state the model does not
  // hold whole lives, and the services that keep it. `master_range`: the master weights of
  // these elements only (a ZeRO shard from stage 1 on, Note [ZeRO]); `master_in_ram` false: they
  // live elsewhere (an offload file) and the caller keeps them. `params_sharded` (ZeRO stage 3,
  // Note [ZeRO stage 3]): the working weights are master_range alone and the step reads the
  // units through the WeightSource, which gathers what each phase needs; every rank must then
  // run the same steps and loads. `params_in_file` (--offload-params, Note [NVMe offload]): no
  // working slab, the source reads the blocks from their file (params() is empty; needs the
  // master weights elsewhere, where there are any). `make_grads` (per-unit reduction, Note [Sharded gradients];
  // --offload-grads): the backward writes each unit's gradients into the store's buffers;
  // grad_sums() is then the store's accumulator where it sums (summed()). The default: one
  // process, everything in RAM. dist/zero/zero_state.h makes it for ZeRO and offload.
  Transformer(const ModelConfig& config, MemoryPool& pool, const PrecisionOptions& precision = {},
              ModelState state = {});

  const ModelConfig& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  const PrecisionOptions& precision() const { return precision_; }
  // The working weights: what forward and backward read (f32, bf16 or f16), over
  // params_range(): the whole layout, or at ZeRO stage 3 this rank's shard.
  Tensor& params() { return params_; }
  ElementRange params_range() const { return sharded_ ? master_range_ : whole(); }
  bool params_sharded() const { return sharded_; }
  // --offload-params: the blocks' working weights are in a file; init and loads reach them
  // through set_weights, the update and saves through the WeightSource the caller made
  // (dist/zero/zero_state.h's ZeroServices: WeightGather::update_piece, read_range).
  bool params_offloaded() const { return source_ && source_->from_file(); }
  // At stage 3, after the working shard changed (the optimizer wrote it): every rank calls it
  // at the same point; the persistent units are gathered again. Nothing to do otherwise.
  void working_changed();
  // Stage 3: the bytes the gathers covered since the last call (0 otherwise).
  int64_t take_gathered_bytes() { return source_ ? source_->take_gathered_bytes() : 0; }
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
  // Stored FP8 weights: the working copy of the layout elements in `range` alone (a unit the
  // update in the backward just stepped; whole matrices), as refresh_working computes it.
  void refresh_working(ElementRange range);
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
  Tensor& grad_sums() { return summing() ? *store_->summed() : grads_; }
  ElementRange grad_sums_range() const { return summing() ? store_->sums_range() : whole(); }
  // The summed gradients of `r`, a range inside grad_sums_range().
  Tensor grad_sums(ElementRange r);
  // Whether every micro-batch's backward reduces its gradients per unit (over the ranks, or
  // into bf16) itself: the store sums them (GradStore::summed).
  bool grads_per_unit() const { return summing(); }
  // --offload-grads (model/grad_store.h): no slab; the gradients live per unit in the store,
  // which the update reads unit by unit. Null otherwise (also for a summing store).
  GradStore* grad_store() { return store_ && !summing() ? store_.get() : nullptr; }
  // One parameter's working weights (a test helper; a block linear of a quantized base has
  // none: quant_base()).
  Tensor param(const std::string& name) const;
  // A quantized base (ModelState::base_quant: NF4 or int8): the layout of the blocks' linear
  // weights and its buffer (Category::params, "base.nf4" or "base.int8"); null / undefined
  // otherwise. params() then holds every other parameter at ParamLayout::compact_offsets (not
  // the layout's offsets).
  const QuantBaseLayout* quant_base() const { return quant_ ? &*quant_ : nullptr; }
  const Tensor& quant_buffer() const { return quant_buffer_; }
  // --precision fp8 with stored weights (ModelState::params_fp8; Note [FP8], "Storage"): the
  // layout of the blocks' linear weights as E4M3 and its buffer (Category::params,
  // "params.fp8": the codes, then a scale per matrix), encoded from the master weights by
  // refresh_working; null / undefined otherwise. params() then holds every other parameter at
  // ParamLayout::compact_offsets, as with a quantized base. Under --tp the codes are this
  // rank's slice of each matrix, encoded with the whole matrix's scale (the group agrees on it:
  // Note [FP8], "Under --tp and --pp").
  const Fp8WeightLayout* fp8_weights() const { return fp8_ ? &*fp8_ : nullptr; }
  const Tensor& fp8_buffer() const { return fp8_buffer_; }
  // Where parameter i of layout().params() lies in params(): its layout offset, or with a
  // quantized base or stored FP8 weights its compact offset (-1 for a block linear weight).
  int64_t working_offset(size_t i) const;
  // A quantized base's save (Note [NF4 weights], "QLoRA"): layout elements `range` of the base
  // in the working dtype, handed to `take` in consecutive runs that tile it: the compact slab's
  // parameters from RAM, the quantized linears dequantized (the values the matmuls multiply
  // by) a piece at a time into `staging` (its bytes, at least one element), zeros in the
  // alignment gaps between parameters.
  using BaseTake = std::function<void(int64_t from, int64_t to, const void* src)>;
  void read_base_range(ElementRange range, const BaseTake& take, const Tensor& staging) const;
  // Sets the weights from `fill` as set_weights does, except the quantized linears, which are
  // left as they are (a resume reads them from the save: io/checkpoint/quant_base_file.h).
  void set_weights_except_quant_base(const RangeFill& fill, int64_t piece_elements);
  // The quantized base's buffer, to read into (a resume).
  Tensor& quant_buffer() { return quant_buffer_; }
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

  // Tensor parallelism (config().tp > 1; Note [Tensor parallel]): the group the step's layers
  // are split over (the caller keeps it alive), whose rank() is this model's slice; of
  // config().tp ranks. Before init_weights (which draws the rank's slice of the whole model's
  // values) and before the first step; kept over reserve().
  void set_tensor_group(TensorGroup& group);
  TensorGroup* tensor_group() const { return group_; }  // null: one process
  // --tp above n_kv_head (config().kv_replicas() > 1): sums the key/value weights' gradients
  // over the ranks that hold the same head, in rank order, so every replica holds the whole
  // head's gradient (each computed its own queries' share). Once per step, after its backward
  // passes and before the update (the trainer's update calls it); collective over the tensor
  // group. Nothing otherwise.
  void reduce_kv_replicas();
  // --sp (the plan's options.sequence_parallel under --tp; Note [Sequence parallel]): each
  // tensor rank's backward saw only its rows of the norms, so their gains' and biases'
  // gradients (sequence_partial) are summed over the group, in rank order (one all-reduce of
  // each), after which every rank holds the whole gradient. Once per step, beside
  // reduce_kv_replicas; nothing otherwise.
  void reduce_sequence_partials();

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
  // With a loss mask (docs/data.md, "Loss masks"): mask (B, T) u8, 1 where the target counts.
  // Returns the SUM of the cross-entropy over the masked-in positions (not a mean: the caller
  // knows the denominator, the masked-in targets of the whole step), and in training seeds
  // `dloss` (the caller's loss_scale / denominator, times whatever the update divides by) into
  // each masked-in position's gradient. A masked-out position adds exactly 0 to the loss and
  // to every gradient, so its target's value does not matter (its input token still serves as
  // context to the positions after it).
  float forward_masked(const Tensor& tokens, const Tensor& targets, const Tensor& mask,
                       bool training, float dloss);
  // Accumulates (+=) every parameter's gradient of the last training forward into grads().
  void backward();
  // The same, calling final_from(e) whenever the gradient slab's elements [e, end) are final for
  // this micro-batch: the layout puts the blocks in order between the embeddings and the final
  // norm (and an untied head), and the backward finishes them from the last, so what is final
  // is always a suffix; e = 0 at the end. Data parallelism starts summing them meanwhile.
  // With per-unit gradients every backward reduces them (final_from is not called).
  void backward(const std::function<void(int64_t final_from)>& final_from);
  void zero_grad();

  // LoRA (model/lora.h, Note [LoRA]): adds the adapters of `options` to the blocks' linear
  // layers, their weights (f32, Category::params, "lora.params") drawn from `seed` as PEFT
  // does (B zero: the model computes what it did) and their gradients (f32, Category::grads,
  // "lora.grads"), which backward() accumulates and zero_grad() zeroes. `freeze_base`: the base
  // weights get no gradients (no slab: grads() is undefined; the step skips their GEMMs).
  // fp32 or bf16, one process or ZeRO stage 0, stage 3's gathered base, or in one process the
  // base's blocks in a file, read only (the adapters bound into the source's views after each
  // gather or read: WeightSource::set_bind_hook); no per-unit gradients; before reserve(). Once.
  void add_lora(const LoraOptions& options, uint64_t seed, bool freeze_base = true);
  const LoraLayout* lora() const { return lora_ ? &*lora_ : nullptr; }
  Tensor& lora_weights() { return lora_weights_; }
  Tensor& lora_grads() { return lora_grads_; }
  // --tp: the gradients of the adapters' matrices every tensor rank holds whole (column-parallel
  // A, row-parallel B: LoraLayout::replicated_ranges) summed over the tensor group, once a step
  // before the update. Nothing without LoRA or --tp.
  void reduce_lora_partials();
  // LoRA dropout (--lora-dropout above 0): the draw of the next training micro-batch's mask,
  // lora_dropout_draw(seed, step, micro-batch, rank) (model/lora_dropout.h); 0 until set.
  void set_lora_dropout_draw(uint64_t draw) { lora_draw_ = draw; }

  // A pipeline stage (reserved with ActivationOptions::stage; Note [Pipeline parallel]): where
  // the next forward and backward read and write the tensors that cross the stage's edges
  // (model/transformer_step.h, StageIo). A stage's forward returns 0 unless it has the head.
  void set_stage_io(const StageIo& io) { stage_io_ = io; }

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
  // The views the step reads: of params_, or the source's (stage 3's gathered units, the file).
  const ModelWeights& working_views() const { return source_ ? source_->weights() : weights_; }
  // The store sums the gradients itself (the per-unit reduction).
  bool summing() const { return store_sums_; }

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
  TensorGroup* group_ = nullptr;  // --tp: the step's tensor group (null: one process)
  bool backward_ready_ = false;
  bool sharded_ = false;
  // Stage 3's gathers, or --offload-params' file: the working weights the step reads.
  std::unique_ptr<WeightSource> source_;
  // The gradients per unit: reduced over ranks (stages 2-3, 0-1 reducing every micro-batch,
  // bf16), or --offload-grads' file; no slab of the model's own then.
  std::unique_ptr<GradStore> store_;
  bool store_sums_ = false;  // store_->summed() is defined
  std::optional<LoraLayout> lora_;
  Tensor lora_weights_, lora_grads_;
  // A quantized base: its layout and buffer, and each parameter's offset in the compact slab.
  std::optional<QuantBaseLayout> quant_;
  Tensor quant_buffer_;
  std::vector<int64_t> compact_;  // (also with stored FP8 weights)
  // --precision fp8's stored linear weights.
  std::optional<Fp8WeightLayout> fp8_;
  Tensor fp8_buffer_;
  // The working copy of the master weights' elements in `range`: the compact slab's parameters
  // rounded to bf16, the stored linears encoded (refresh_working over the whole layout).
  // Under --tp every rank of the tensor group refreshes the same matrices together.
  void refresh_fp8(ElementRange range);
  // Under --tp (a slice of each stored matrix here) the tensor group's agreement on the whole
  // matrices' amaxes (fp8_amax_agree); empty where each matrix is whole.
  Fp8AmaxAgree fp8_agree() const;
  void set_weights_quant(const RangeFill& fill, int64_t piece_elements, bool quantize);
  uint64_t lora_draw_ = 0;
  StageIo stage_io_;
  bool frozen_ = false;  // LoRA's frozen base: no gradient slab
  // Binds the adapters' views into weights_ and grad_views_ (after either is rebuilt).
  void bind_lora();
  // The views the step writes gradients through.
  const ModelWeights& grad_views() const { return store_ ? store_->views() : grad_views_; }
};

}  // namespace memfit
