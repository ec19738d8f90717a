// The step of every family, described once (Note [One step description]): the embedding, each
// block's forward, the final norm, the fused chunked LM head (Note [Fused LM head]), then the
// backward from the top, each recomputed segment just before the backward of its last block,
// down to the embedding's. The family's block code (model_family.h) runs inside it. Transformer
// runs it on its weights; plan_step (step_plan.h) runs it without weights to record the plan.
#pragma once

#include <functional>

#include <vector>

#include "memfit/model/block_step.h"
#include "memfit/model/family_compute.h"
#include "memfit/model/model_config.h"
#include "memfit/model/model_family.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/sequence_parallel.h"
#include "memfit/model/step_context.h"

namespace memfit {

// A pipeline stage's transfers (ActivationOptions::stage; Note [Pipeline parallel]), each
// the residual stream of the micro-batch, f32 (B x T x d_model; with --sp the tensor rank's
// B x T / tp rows): the next forward copies its input from `input` (stages after the first)
// and its output into `output` (stages before the last; null: not copied, as for the forward a
// backward reruns first); the next backward copies its output's
// gradient from `dout` (before the last) and its input's gradient into `din` (after the first).
struct StageIo {
  const float* input = nullptr;
  float* output = nullptr;
  const float* dout = nullptr;
  float* din = nullptr;
};

class TransformerStep {
 public:
  TransformerStep(const ModelConfig& config, const ActivationOptions& options, int B, int T);

  // Mean cross-entropy of predicting targets from tokens ((B, T) i32 each; null when planning),
  // the LM head's backward fused in when `training` (dloss: the loss gradient per position).
  // Returns the summed loss. `mask` ((B, T) u8, or null): only the positions whose mask is 1
  // count, in the loss and in every gradient (crossentropy.h; docs/data.md, "Loss masks").
  float forward(StepContext& ctx, const ModelWeights& w, const ModelWeights& g,
                const Tensor* tokens, const Tensor* targets, bool training, float dloss,
                const Tensor* mask = nullptr);
  // Accumulates every parameter's gradient of the last training forward into g.
  // `done`, if set, is called (running only) after the final norm's backward with n_layer, after
  // block l's with l, and after the embedding's with -1 (a pipeline stage after the first: at
  // the end of its backward): the gradients that part writes last are then final (data
  // parallelism starts summing them, dist/grad_sync.h).
  void backward(StepContext& ctx, const ModelWeights& w, const ModelWeights& g,
                const std::function<void(int)>& done = {});
  // f32 logits (B, T, vocab_size) of every position.
  void logits(StepContext& ctx, const ModelWeights& w, const Tensor& tokens, Tensor& out);

  // LoRA dropout's draw for the next training micro-batch (lora_dropout_draw; Note [LoRA],
  // "Dropout"): its forward, recomputations and backward drop the adapters' input by it.
  void set_lora_draw(uint64_t draw) { lora_draw_ = draw; }

  // Pipeline stage: where the next forward and backward read and write (see StageIo).
  void set_stage_io(const StageIo& io) { io_ = io; }
  // The stage this step runs (the whole model: stage 0 of 1, every block).
  const PipelineStage& stage() const { return stage_; }

  // The final norm's output tag: "ln_f" (GPT-2) or "norm" (LLaMA).
  const char* final_norm_tag() const { return family_.final_norm_tag; }

 private:
  int64_t vocab_begin(const StepContext& ctx) const;
  // --sp (Note [Sequence parallel]): whether the sequence is split, and the residual stream's
  // shape on this rank ((B, T, C) without it, (B T / tp, C) with it).
  bool sp() const { return sequence_parallel(config_, options_); }
  Shape stream_shape() const;
  // `training`: a backward follows, so the kept blocks compress what they save
  // (--act-compress); an evaluation forward leaves the codes alone (nothing will read them).
  void forward_blocks(StepContext& ctx, const ModelWeights& w, const ModelWeights& g,
                      const Tensor* tokens, bool training);
  void block_forward(StepContext& ctx, PhaseKind kind, int l, const ModelWeights& w,
                     const ModelWeights& g, bool training = true);
  // A training phase's LoRA dropout (off where options_.lora_dropout is 0).
  LoraDropout lora_dropout() const { return {options_.lora_dropout, lora_draw_}; }
  void lm_head(StepContext& ctx, const ModelWeights& w, const ModelWeights& g,
               const Tensor* targets, const Tensor* mask, bool training, float dloss,
               float* loss_sum);

  const ModelConfig config_;
  const ActivationOptions options_;
  const int B_, T_;
  const ModelFamily& family_;
  const FamilyCompute& compute_;
  const BlockSlots slots_;
  const PipelineStage stage_;
  StageIo io_;
  uint64_t lora_draw_ = 0;
  std::vector<float> rope_inv_freq_;  // LLaMA: the rotary frequencies, from the config once
};

}  // namespace memfit
