// A run as the planner sees it: the options of `memfit train` / `memfit plan`, parsed and
// validated once (cli/options/resolve_train_spec.h: resolve_run) into types. plan_training, the
// search (--ckpt auto, --auto-batch), --max-model and the out-of-memory advice all read it, and
// vary its typed fields (the policy, the micro-batch, the precision, the optimizer, the shape);
// none of them parses an option again. plan/ knows nothing of train/: this is its whole input.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "memfit/core/dtype.h"
#include "memfit/model/activation_plan.h"
#include "memfit/model/checkpoint_policy.h"
#include "memfit/model/lora.h"
#include "memfit/model/model_config.h"
#include "memfit/model/pipeline_schedule.h"
#include "memfit/model/pipeline_stages.h"
#include "memfit/model/precision.h"
#include "memfit/optim/optim_config.h"
#include "memfit/optim/unit_steps.h"
#include "memfit/plan/link_model.h"
#include "memfit/state/state_placement.h"

namespace memfit {

// Where the model state lives beyond RAM (Note [NVMe offload], docs/notes/offload.md).
struct OffloadOptions {
  // --offload-optimizer nvme: the optimizer state and the FP32 master weights (where the
  // precision keeps them) in scratch files in `dir`, streamed through a staging ring per update.
  bool optimizer = false;
  // --offload-params nvme: the blocks' working weights in a file in `dir` too, read per block
  // before each use (needs `optimizer`: the update that streams the state writes them back).
  bool params = false;
  // --offload-grads nvme (one process, with the optimizer offloaded): the f32 gradients per
  // unit in a scratch file, written as each unit's backward ends and read by the update
  // (offload/offloaded_grads.h); RAM holds a unit's buffers instead of the slab.
  bool grads = false;
  std::string dir;  // --offload-dir
  // --disk-limit in bytes: the most the offload files may take (0: the free space of `dir`,
  // which the trainer checks anyway). --max-model counts a member as fitting only if its files
  // fit too.
  uint64_t disk_limit = 0;
};

// The precision a run keeps: `asked`, except that LoRA in bf16 keeps no FP32 master copy of
// its frozen base (Note [LoRA], "bf16"): the base is its bf16 weights alone, the adapters f32.
// resolve_run and the fit advice's bf16 lever both ask it.
PrecisionOptions run_precision(PrecisionOptions asked, const LoraOptions& lora);

struct RunSpec {
  ModelConfig model;  // resolved: the checkpoint's when resuming or initialising, else the preset
  int T = 0;          // sequence length
  int batch = 1, grad_accum = 1;  // micro-batch rows, micro-batches per optimizer step
  int64_t steps = 0;
  PrecisionOptions precision;
  // LoRA (Note [LoRA]): the base frozen, the adapters trained; fp32 or bf16 (the base bf16
  // alone, no master weights), one process, in RAM.
  LoraOptions lora;
  AttentionKind attention = AttentionKind::flash;
  int lm_head_group = 0;       // --lm-head-group (ActivationOptions::lm_head_group)
  CheckpointPolicy ckpt;       // the policy to plan (none while ckpt_auto: the search sets it)
  // How kept activations are stored; a search may change it while act_compress_open.
  ActCompress act_compress = ActCompress::none;
  OptimConfig optim;           // n_head is the model's
  int threads = 0;             // 0: all cores
  int world = 1;               // data-parallel ranks (model.tp: the tensor-parallel ones, --tp)
  // --sp: sequence parallelism within the tensor group (ActivationOptions::sequence_parallel;
  // Note [Sequence parallel]); refused without --tp above 1.
  bool sp = false;
  // --tp-overlap on: the column-parallel layers' d(input) sums (all-reduces, reduce-scatters with
  // --sp) run on a communication thread while the weight gradients compute (Note [Tensor
  // parallel], "Overlap"); the step-time estimate prices each as hidden behind its layer's
  // weight-gradient GEMM. Refused without --tp above 1.
  bool tp_overlap = false;
  // Pipeline parallelism (--pp, --pp-layers, --pp-schedule; Note [Pipeline parallel]): the cut
  // of the model into stages (empty: one stage, the whole model) and the order in which each
  // stage runs the step's grad_accum micro-batches. The ranks are world x pp() x model.tp.
  // `model` stays the whole model's; stage(s) is the run of stage s, whose model holds the
  // stage's parameters alone (ModelConfig::stage): what a rank of that stage trains and plans.
  std::vector<PipelineStage> pipeline;
  // --pp-layers auto: `pipeline` is the even split until the planner balances it
  // (plan/pipeline_time.h: balance_stages), as `memfit plan` and the trainer's resolution do.
  bool pp_layers_auto = false;
  PipeSchedule pipe_schedule = PipeSchedule::one_f_one_b;
  // --pp-schedule interleaved --pp-virtual V (Note [Pipeline parallel], "Interleaved"): each
  // rank holds V chunks, Megatron's interleaved 1F1B over them (model/pipeline_interleaved.h;
  // pipe_schedule stays one_f_one_b, which the interleaved order is at V = 1). `pipeline` is
  // then the P x V chunks, virtual stage by virtual stage, and stage(s) the run of virtual stage
  // s (rank s mod P's chunk s / P). 1: one stage a rank.
  int pipe_virtual = 1;
  bool interleaved() const { return pipe_virtual > 1; }
  int pp() const {
    return pipeline.empty() ? 1 : static_cast<int>(pipeline.size()) / pipe_virtual;
  }
  // The links between the ranks (--link, --ranks-per-node): what the step-time estimate prices
  // each collective and point-to-point transfer on (plan/link_model.h). Time only: no byte
  // depends on it.
  LinkModel links;
  RunSpec stage(int s) const;
  // ZeRO stage: what each rank shards (Note [ZeRO]); with world 1, every stage is stage 0.
  int zero = 0;
  // --zero auto: the search picks the stage over several ranks (zero is 0 until it does;
  // with one rank it stays 0). Note [Fit a budget].
  bool zero_auto = false;
  // Stage 3 (Note [ZeRO stage 3]): blocks gathered ahead of the one computing, and the block
  // size (elements) under which a block is kept whole.
  int prefetch_depth = 1;
  int64_t persist_threshold = 0;
  // Stages 0-1 reduce every micro-batch's gradients per unit, as stages 2-3 always do (Note
  // [Sharded gradients]): the same sums as stages 2-3 under gradient accumulation.
  bool sync_every_micro_batch = false;
  // The gradients' type (--grad-dtype): f32, or bf16, kept and reduced per unit at every stage
  // and with one process (Note [Gradients in bf16]: the kernels cannot add into bf16).
  DType grad_dtype = DType::f32;
  // Whether each micro-batch's gradients are reduced per unit (UnitGrads): the placement's
  // answer (StatePlacement::grads_per_unit: stages 2-3, or stages 0-1 with
  // sync_every_micro_batch, over several ranks; or bf16 gradients, but not with --offload-grads,
  // whose store sums bf16 per unit itself).
  bool unit_grads() const { return StatePlacement::grads_per_unit(state_options(), world); }
  size_t bucket_bytes = 0;     // gradients all-reduced this many bytes at a time (world > 1)
  size_t mem_limit = 0;        // the pool's budget in bytes; 0: none
  std::string data_dir;        // the token shards whose staging the plan counts
  // --save given: the run saves (at least at its end), which may hold a staging buffer
  // (save_staging_elements in plan/memory_plan.h).
  bool saves = false;
  bool shuffle = true;
  bool resumed = false;        // from a checkpoint: its micro-batch, precision and optimizer stay
  bool ckpt_auto = false;      // --ckpt auto: the planner picks the policy
  // --act-compress not given (and not resuming, which keeps the checkpoint's): a search may
  // choose it; --ckpt auto and --max-model then try compressing the kept activations beside
  // the policies (Note [Activation compression]).
  bool act_compress_open = false;
  bool auto_batch = false;     // --auto-batch: the planner picks the micro-batch
  OffloadOptions offload;
  // --offload-dir given without --offload-optimizer: a search may choose to offload (when
  // nothing fits in RAM, or it is faster than what does).
  bool offload_open = false;
  // --offload-dir given without --offload-grads: in one process a search may also keep the
  // gradients on disk where it offloads the optimizer (Note [NVMe offload], "Choosing offload").
  bool offload_grads_open = false;
  // `memfit plan --auto` and `--max-model` in bf16 with neither --master-weights nor
  // --grad-dtype given (nor resuming): where nothing fits as asked, the search may keep the
  // gradients in bf16, then also drop the FP32 master weights (kPrecisionLevers; Note [Fit a
  // budget], "Precision levers").
  bool precision_levers_open = false;
  // --update-in-backward (Note [Update in backward]): the optimizer steps each unit as the
  // backward finishes it; the gradients are unit buffers (optim/backward_update.h; at stages
  // 2-3 the per-unit reduction's), no slab. One process or --zero 2|3, one micro-batch a step,
  // no loss scale, f32 gradients, nothing offloaded (check()).
  bool update_in_backward = false;
  // --clip (0: off) and --clip-mode: what the trainer's update clips by, and with
  // --update-in-backward how many passes a step runs (backward_passes()).
  float clip = 1.0f;
  UnitSteps::Clip clip_mode = UnitSteps::Clip::global;

  // The forward+backward passes each step runs of its micro-batch: 2 with --update-in-backward
  // and clipping on the global norm (LOMO's measuring pass, then the stepping pass: Note
  // [Update in backward], "Clipping"), else 1. The trainer runs them (UnitSteps::passes, whose
  // count it checks against this); the planner prices them (step time, FLOPs, collectives).
  int backward_passes() const {
    return update_in_backward ? UnitSteps::passes(clip, clip_mode) : 1;
  }
  // The micro-batch passes a step runs: grad_accum, times backward_passes().
  int micro_batch_passes() const { return grad_accum * backward_passes(); }

  // Whether the f32 gradient slab lives in the activations arena by lifetime (Note [Gradients
  // by lifetime]): where the step has one micro-batch and a whole f32 slab that the update
  // reads right after it (in one process, or all-reduced bucket by bucket as the backward
  // finishes them at stages 0-1). Not under accumulation, whose next forward needs the
  // activations' bytes while the gradients are kept; not with per-unit (stages 2-3, bf16) or
  // offloaded gradients, nor an offloaded update.
  bool grads_share_arena() const {
    return grad_accum == 1 && pp() == 1 && grad_dtype == DType::f32 && !unit_grads() &&
           !offload.optimizer &&
           !offload.grads && !update_in_backward && !lora.enabled();
  }
  // What the run asks of where its state lives; StatePlacement decides it per rank (Note
  // [State placement]): the trainer, the planner and the saves read that, not `zero`.
  StateOptions state_options() const;
  // What the model's step is planned and built with.
  ActivationOptions activation_options() const;
  // The rules between the typed fields (the model's precision and attention rules, the
  // optimizer's, pure bf16's need of AdamW): ConfigError naming the option at fault. The search
  // calls it for every combination it tries; resolve_run for the run as given.
  void check() const;
  // check()'s rules for --tp above 1 (model.tp; Note [Tensor parallel]).
  void check_tensor_parallel() const;
  // check()'s rules for --pp above 1 (Note [Pipeline parallel]).
  void check_pipeline() const;
  // check_pipeline's rules for --pp-schedule interleaved (what is built so far).
  void check_interleaved_run() const;
  // check()'s rules for --update-in-backward (Note [Update in backward]).
  void check_update_in_backward() const;
  // check()'s rules for --base-dtype (Note [NF4 weights], "QLoRA").
  void check_base_dtype() const;
};

// The run's --pp-schedule as the logs and the plan print it: "gpipe", "1f1b", or "interleaved
// (--pp-virtual V)".
std::string pipe_schedule_label(const RunSpec& spec);

}  // namespace memfit
