// Everything `memfit train` can be told, with its defaults, as strings and numbers the way the
// command line and TOML config files give them. It stays in cli/: resolve_train_spec.h checks
// and parses it once into the typed TrainSpec (train/train_spec.h) that train() takes, so
// nothing below cli/ sees an option's string.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/model/activation_plan.h"
#include "memfit/model/lora.h"
#include "memfit/model/model_config.h"
#include "memfit/model/precision.h"
#include "memfit/optim/optimizer.h"
#include "memfit/train/loss_scaler.h"
#include "memfit/train/lr_schedule.h"

namespace memfit {

struct TrainConfig {
  // Model: a preset, optionally overridden field by field (0 = keep the preset's). Empty: the
  // checkpoint's with --resume or --init-from, else kDefaultModel (model_name()); named with a
  // checkpoint, it and the overrides must agree with the checkpoint (resolve_run_model).
  static constexpr const char* kDefaultModel = "gpt2-small-test";
  std::string model;
  int n_layer = 0, n_head = 0, d_model = 0, seq_len = 0, vocab = 0;
  // LLaMA family only (ConfigError on a GPT-2 preset): 0 / empty keep the preset's.
  int n_kv_head = 0, ffn_dim = 0;
  double rope_theta = 0;
  std::string tie_embeddings;  // "true" | "false"

  std::string data_dir = "data/brown";
  int batch = 8;        // micro-batch rows
  int grad_accum = 1;   // micro-batches per optimizer step
  int64_t steps = 100;
  LrSchedule schedule;  // --lr, --lr-schedule, --warmup, --min-lr
  OptimConfig optim;    // --optim, --beta1, --beta2, --eps, --weight-decay
  float clip = 1.0f;    // global gradient norm; 0 turns clipping off
  // What --clip bounds: global (the whole gradient's norm) or unit (each unit's own norm, with
  // --update-in-backward only: another algorithm; Note [Update in backward]).
  std::string clip_mode = "global";
  // Step each unit's optimizer as the backward finishes its gradients: no gradient slab (Note
  // [Update in backward], optim/backward_update.h).
  bool update_in_backward = false;
  // --lora-rank, --lora-alpha, --lora-targets, --lora-dropout (Note [LoRA]): rank 0 is off.
  LoraOptions lora;
  uint64_t seed = 1337;
  int threads = 0;      // 0: all cores
  // Data parallelism (under mpirun or srun: every rank a copy of the model, gradients
  // all-reduced in buckets of this many MiB; docs/notes/zero.md).
  double bucket_mb = 25;
  // The longest a rank waits for one collective before the job fails (a rank that stopped or
  // hung; Note [Failures] in docs/notes/zero.md); 0: forever. Longer than the longest save, which
  // the other ranks wait for.
  double collective_timeout = 1800;
  // The ranks to plan for (memfit plan --ranks); train(config, grid) sets it to the grid's
  // (train_from_config.h). Data-parallel ranks: ranks / tp.
  int ranks = 1;
  // --tp: tensor-parallel ranks, neighbours in the grid (Note [Tensor parallel]); the data
  // group is ranks / tp.
  int tp = 1;
  // --sp: sequence parallelism within each tensor group (Note [Sequence parallel]).
  bool sp = false;
  // --tp-overlap on|off: the column-parallel layers' d(input) sums on a communication thread
  // while the weight gradients compute (Note [Tensor parallel], "Overlap").
  std::string tp_overlap = "off";
  // --pp: pipeline stages, each a contiguous range of blocks (Note [Pipeline parallel]);
  // --pp-layers auto (an even split) or each stage's block count ("5,7"); --pp-schedule gpipe
  // 1f1b or interleaved (--pp-virtual chunks a rank). The micro-batches are --grad-accum's.
  int pp = 1;
  std::string pp_layers = "auto";
  std::string pp_schedule = "1f1b";
  int pp_virtual = 1;
  // --link intra=BW,LAT / inter=BW,LAT and --ranks-per-node: the links the step-time estimate
  // prices collectives and pipeline transfers on (plan/link_model.h); 0 ranks a node: one node.
  std::vector<std::string> links;
  int ranks_per_node = 0;
  // ZeRO stage (docs/notes/zero.md): 0 every rank holds everything; 1 the optimizer state and
  // FP32 master weights sharded; 2 the gradients reduce-scattered into the shard owners too.
  // 3 the working weights sharded too, each block gathered as the step needs it
  // (Note [ZeRO stage 3]). With one rank every stage is stage 0.
  int zero = 0;
  // --zero auto (with --mem-limit): the planner picks the stage over several ranks, the lowest
  // of the fastest that fit (Note [Fit a budget]); zero stays 0 until it does. With one rank:
  // stage 0.
  bool zero_auto = false;
  // `memfit plan --auto` over several ranks with neither --tp nor --pp given: the search also
  // chooses the layout, tp x pp x dp of --world-size (plan/layout_search.h; plan only).
  bool auto_layout = false;
  // Stage 3: blocks gathered ahead of the one computing (0: each gathered when needed), and the
  // block size in elements under which a block is kept whole (gathered once per update).
  int prefetch_depth = 1;
  int64_t persist_threshold = 0;
  // Stages 0-1 reduce every micro-batch's gradients per unit, as stages 2-3 must: the same bits
  // as stages 2-3 under --grad-accum (Note [Sharded gradients]).
  bool sync_every_micro_batch = false;
  std::string grad_dtype = "fp32";  // --grad-dtype fp32|bf16
  std::string mem_limit;  // pool budget, e.g. "2GiB"; empty: unlimited
  // NVMe offload (docs/notes/offload.md): none | nvme, and the directory of the scratch files.
  // Empty (not given): none, but with --offload-dir --ckpt auto and --auto-batch may choose nvme.
  std::string offload_optimizer;
  std::string offload_params = "none";  // none | nvme (Note [NVMe offload])
  std::string offload_grads;  // none | nvme
  std::string offload_dir;
  std::string disk_limit;  // e.g. "100GiB"; empty: the free space of offload_dir

  int64_t eval_every = 0;  // 0: only at the end
  int eval_batches = 8;
  std::string save_dir;
  int64_t save_every = 0;  // 0: only at the end
  std::string max_shard_size = "5GB";  // weights above it are sharded (io/checkpoint/sharded_safetensors.h)
  double save_every_minutes = 0;  // also save when this long has passed since the last (0: off)
  std::string resume_dir;
  std::string init_from;
  // --lora-from ADAPTER_DIR (with --init-from BASE): the run's LoRA adapters start from PEFT's
  // files there; adopt_lora_from (cli/options/lora_from.h) takes their rank, alpha and targets.
  std::string lora_from;
  std::string log_file;  // JSON lines
  bool shuffle = true;
  // Every step trains on the same micro-batches: the ones the run's first step reads (after a
  // resume, the ones at the saved position). A check that a model and its optimizer can fit one
  // batch (the loss must fall), and the offload headline's "one fixed batch".
  bool repeat_batch = false;
  std::string attention = "flash";  // flash | plain
  // Rows of the LM head's gradient per weight-gradient GEMM on oneDNN's bf16 GEMM; 0: the
  // default, 512 (ActivationOptions::lm_head_group).
  int lm_head_group = 0;
  // none | full | selective | every:K | layers:LIST, or auto: the planner picks the fastest
  // policy that fits mem_limit (cli/options/resolve_train_spec.h) before anything is built.
  std::string ckpt = "none";
  // How the blocks that keep their activations store them: none | int8 | fp8 (Note [Activation
  // compression]). Empty (not given): none, except that --ckpt auto may choose int8 and a
  // resumed run keeps its checkpoint's (cli/options/resolve_train_spec.h).
  std::string act_compress;
  // With mem_limit: the planner also picks the micro-batch, every divisor b of
  // batch * grad_accum with grad_accum = global / b, keeping the global batch.
  bool auto_batch = false;
  std::string precision = "fp32";   // fp32 | bf16 | fp16 | fp8 (docs/notes/mixed-precision.md)
  std::string master_weights = "fp32";  // fp32 | none (pure bf16, stochastic rounding)
  LossScalerConfig loss_scaler;     // fp16: --loss-scale-window, --hysteresis, --min-loss-scale
  // Stop after this step as if interrupted (0: run all `steps`); the schedule still spans
  // `steps`. Lets a run be split into sessions with --save and --resume.
  int64_t stop_after = 0;
  // Memory profile (docs/profiling.md): trace.json, memory.html and summary.json of the first
  // profile_steps steps, in profile_dir (profile_dir/rank<r> under MPI); empty: off.
  std::string profile_dir;
  int64_t profile_steps = 3;
  // The leak check runs in every run (profile/leak_check.h); with this a growth of the pool's
  // live bytes between step boundaries after the first makes `memfit train` exit with 4.
  bool fail_on_leak = false;
  // A test hook, not for users: every step after the first allocates this many bytes (tag
  // "test.leak", workspace) and keeps them, so the tests see the leak check catch a leak.
  int64_t test_leak_bytes = 0;

  // Whether the planner has something to choose (--ckpt auto or --auto-batch).
  bool needs_planner() const { return ckpt == "auto" || auto_batch || zero_auto; }

  // The preset's name: `model`, or kDefaultModel where it is empty.
  std::string model_name() const { return model.empty() ? kDefaultModel : model; }
  // The model shape after applying the overrides to the preset; T is seq_len.
  ModelConfig model_config() const;
  // The model's precision these settings name (ConfigError for an unknown name). The activation
  // options are the resolved run's (RunSpec::activation_options, from resolve_run).
  PrecisionOptions precision_options() const;
};

}  // namespace memfit
