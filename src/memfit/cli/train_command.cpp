// memfit train: every option of TrainConfig on the command line or in a TOML --config file,
// then the planner's choice under --ckpt auto / --auto-batch, the training loop, and a table of
// peak memory by category and the throughput. An out-of-memory error carries the planner's
// advice.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "memfit/cli/commands.h"
#include "memfit/cli/config_file.h"
#include "memfit/cli/options/preset_schedule.h"
#include "memfit/cli/options/lora_from.h"
#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/precision_route.h"
#include "memfit/cli/search_output.h"
#include "memfit/core/error.h"
#include "memfit/dist/agreement.h"
#include "memfit/dist/process_grid.h"
#include "memfit/memory/pool.h"
#include "memfit/optim/optim_config.h"
#include "memfit/plan/fit_advice.h"
#include "memfit/profile/curves_page.h"
#include "memfit/train/interrupt.h"
#include "memfit/train/trainer.h"

namespace memfit::cli {

namespace {

void print_summary(const TrainSummary& s) {
  fmt::print("\nmemfit train: {} steps in {:.1f} s, median {:.0f} tokens/s; last loss {:.4f}",
             s.steps_run, s.wall_seconds, s.median_tokens_per_s, s.last_loss);
  if (s.last_val_loss >= 0) fmt::print(", val loss {:.4f}", s.last_val_loss);
  if (s.unigram_entropy > 0)
    fmt::print(" (unigram entropy of the training tokens: {:.4f})", s.unigram_entropy);
  if (s.skipped_steps) fmt::print("; {} steps skipped for overflow", s.skipped_steps);
  fmt::print("\n\n{:<12} {:>12}\n", "peak memory", "MiB");
  for (Category c : kAllCategories) {
    size_t b = s.peak_by_category[static_cast<size_t>(c)];
    if (b) fmt::print("{:<12} {:>12.1f}\n", category_name(c), b / 1048576.0);
  }
  fmt::print("{:<12} {:>12.1f}\n", "total", s.peak_bytes / 1048576.0);
}

// Under --ckpt auto or --auto-batch: the peak the planner chose under --mem-limit against the
// peak the pool measured (under MPI the plan's is the largest rank's, the measurement rank 0's).
void print_planned_peak(const SearchResult& search, const TrainSummary& s, int ranks) {
  fmt::print("peak memory: measured {}{}, planned {}{} under --mem-limit {}\n",
             format_mib(s.peak_bytes), ranks > 1 ? " on rank 0" : "",
             format_mib(search.choice.peak_bytes), ranks > 1 ? " (the largest rank's)" : "",
             format_mib(search.limit));
}

// The log's curves.html (profile/curves_page.h), written whole from the log at the end, so a
// resumed run's page holds every step. The run itself succeeded: a page that cannot be written
// is a warning, not a failed run.
void print_curves(const std::string& log_file) {
  const std::filesystem::path page = profile::curves_path_for_log(log_file);
  try {
    profile::write_curves_page({log_file}, page);
    fmt::print("\nmemfit curves: {} (loss, learning rate, gradient norm, tokens/s and memory "
               "over the steps; memfit curves A.jsonl B.jsonl -o FILE compares runs)\n",
               page.string());
  } catch (const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "memfit: no curves page: {}\n", e.what());
  }
}

}  // namespace

namespace {

// The model: a preset and its shape's overrides.
void add_model_options(CLI::App* cmd, TrainConfig& c) {
  cmd->add_option("--model", c.model,
                  fmt::format("Preset (default {}; with --resume or --init-from, the "
                              "checkpoint's): {}",
                              TrainConfig::kDefaultModel,
                              fmt::join(ModelConfig::preset_names(), ", ")));
  cmd->add_option("--n-layer", c.n_layer, "Override the preset's layers");
  cmd->add_option("--n-head", c.n_head, "Override the preset's heads");
  cmd->add_option("--d-model", c.d_model, "Override the preset's width");
  cmd->add_option("--seq-len", c.seq_len, "Tokens per row (the context, from scratch)");
  cmd->add_option("--vocab", c.vocab, "Override the preset's vocabulary size");
  cmd->add_option("--n-kv-head", c.n_kv_head,
                  "LLaMA: key/value heads (grouped-query attention; divides --n-head)");
  cmd->add_option("--ffn-dim", c.ffn_dim, "LLaMA: the SwiGLU MLP's hidden width");
  cmd->add_option("--rope-theta", c.rope_theta, "LLaMA: the rotary embedding's base");
  cmd->add_option("--tie-embeddings", c.tie_embeddings,
                  "LLaMA: true | false, the LM head is the token embedding (preset's default)");
}

// The data, the batch and the schedule, the optimizer.
void add_schedule_options(CLI::App* cmd, TrainConfig& c) {
  cmd->add_option("--data", c.data_dir, "Directory of train_*.bin / val_*.bin shards")
      ->capture_default_str();
  cmd->add_option("--batch", c.batch, "Micro-batch rows")->capture_default_str();
  cmd->add_option("--grad-accum", c.grad_accum, "Micro-batches per optimizer step")
      ->capture_default_str();
  cmd->add_option("--steps", c.steps, "Optimizer steps")->capture_default_str();
  // A preset with a published schedule brings its own (options/preset_schedule.h; printed).
  cmd->add_option("--lr", c.schedule.lr,
                  "Peak learning rate (default: the preset's published one, else this)")
      ->capture_default_str();
  cmd->add_option("--lr-schedule", c.schedule.kind, "cosine | constant")->capture_default_str();
  cmd->add_option("--warmup", c.schedule.warmup,
                  "Linear warmup steps (default: the preset's published ones, else this)")
      ->capture_default_str();
  cmd->add_option("--min-lr", c.schedule.min_lr,
                  "Cosine floor (default: with a preset's schedule, 10% of the peak, else this)")
      ->capture_default_str();
  cmd->add_option("--optim", c.optim.name,
                  fmt::format("Optimizer: {}", fmt::join(optimizer_names(), " | ")))
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--optim-state-dtype",
         [&c](const std::string& v) { c.optim.state_dtype = optim_state_dtype_from_name(v); },
         "f32 | bf16: AdamW's two moments in bf16 (torchtitan-style; 4 bytes a parameter instead "
         "of 8, each moment rounded to 8 significant bits after every update; --optim adamw "
         "only). Note [bf16 optimizer state] (docs/notes/mixed-precision.md)")
      ->default_str("f32");
  cmd->add_option("--weight-decay", c.optim.weight_decay,
                  "Decoupled weight decay on 2-D weights (not biases or LayerNorm)")
      ->capture_default_str();
  cmd->add_option("--optim-rank", c.optim.rank,
                  "APOLLO's and GaLore's projection rank (0: 256 for apollo, 1 for apollo-mini, "
                  "128 for galore and galore8bit; capped at each matrix's smaller side)")
      ->capture_default_str();
  cmd->add_option("--optim-proj-gap", c.optim.proj_gap,
                  "APOLLO and GaLore: steps between new projections (APOLLO's random matrices, "
                  "GaLore's SVDs; the papers' update_proj_gap)")
      ->capture_default_str();
  cmd->add_option("--beta1", c.optim.beta1)->capture_default_str();
  cmd->add_option("--beta2", c.optim.beta2)->capture_default_str();
  cmd->add_option("--eps", c.optim.eps)->capture_default_str();
  cmd->add_option("--clip", c.clip, "Gradient-norm clip (0: off); what it bounds: --clip-mode")
      ->capture_default_str();
  cmd->add_option("--clip-mode", c.clip_mode,
                  "global: --clip bounds the whole gradient's norm (with --update-in-backward: "
                  "a second forward and backward per step); unit (with --update-in-backward): "
                  "each unit (the embeddings, each block, the tail) by its own norm, a "
                  "different algorithm, in one pass")
      ->check(CLI::IsMember({"global", "unit"}))
      ->capture_default_str();
  cmd->add_flag("--update-in-backward", c.update_in_backward,
                "Step each unit's optimizer as soon as the backward finishes its gradients: no "
                "gradient slab, only a unit's buffer. One process or --zero 2|3, --grad-accum 1, "
                "not fp16, not --offload-grads (--offload-optimizer and --offload-params stream each "
                "unit's state in the backward, in one process or each rank's shard); --clip "
                "above 0 costs a second pass "
                "(--clip-mode global) or "
                "clips per unit (--clip-mode unit). Note [Update in backward] "
                "(docs/notes/update-in-backward.md)");
  cmd->add_option("--seed", c.seed)->capture_default_str()->check(kNonNegative);
  // LoRA (docs/notes/lora.md): the base weights frozen, adapters on the targets trained.
  cmd->add_option("--lora-rank", c.lora.rank,
                  "LoRA: train rank-r adapters on the blocks' linear layers, the base frozen "
                  "(0: off; fp32, or bf16 with the base in bf16 alone; one process, or "
                  "data-parallel ranks at --zero 0 or 3; with --tp and --pp at --zero 0)")
      ->capture_default_str()
      ->check(kNonNegative);
  cmd->add_option("--lora-alpha", c.lora.alpha, "LoRA: the adapters' output is scaled by alpha/r")
      ->capture_default_str();
  cmd->add_option("--lora-targets", c.lora.targets,
                  "LoRA: comma-separated layers: LLaMA q,k,v,o,gate,up,down; GPT-2 attn "
                  "(c_attn), proj (attn.c_proj), fc (c_fc), mlp_proj (mlp.c_proj); or all-linear")
      ->capture_default_str();
  cmd->add_option("--lora-dropout", c.lora.dropout,
                  "LoRA: dropout probability on the adapters' input in training, in [0, 1)")
      ->capture_default_str();
  cmd->add_option_function<std::string>(
         "--base-dtype", [&c](const std::string& v) { c.lora.base = lora_base_from_name(v); },
         "LoRA: how the frozen base's block linear weights are stored: bf16 (--precision bf16's "
         "base), nf4 (QLoRA: 4-bit NormalFloat, 64-blocks, double-quantised scales) or int8 "
         "(LLM.int8's weights: one byte a weight, one f32 absmax per row); quantised once at "
         "load; the embeddings, norms and head as --precision says; fp32 or bf16, one process. "
         "Note [NF4 weights] (docs/notes/nf4.md), Note [Int8 weights] (docs/notes/int8-base.md)")
      ->default_str("the precision's");
  cmd->add_option("--lora-from", c.lora_from,
                  "LoRA: start the adapters from PEFT's files in this directory "
                  "(adapter_model.safetensors, adapter_config.json: its r, lora_alpha and "
                  "target_modules, which options given must equal), with --init-from BASE");
  cmd->add_option("--threads", c.threads, "Threads (0: all cores)")->capture_default_str();
}

// Data parallelism and ZeRO (under mpirun or srun).
void add_parallel_options(CLI::App* cmd, TrainConfig& c) {
  cmd->add_option("--bucket-mb", c.bucket_mb,
                  "Data parallelism (under mpirun or srun): gradients are summed over the ranks "
                  "this many MiB at a time")
      ->capture_default_str();
  // A stage, or auto: the planner's choice under --mem-limit (Note [Fit a budget]).
  cmd->add_option_function<std::string>(
         "--zero",
         [&c](const std::string& v) {
           c.zero_auto = v == "auto";
           if (c.zero_auto) {
             c.zero = 0;
             return;
           }
           size_t end = 0;
           int stage = -1;
           try {
             stage = std::stoi(v, &end);
           } catch (const std::exception&) {
             end = 0;
           }
           if (end == 0 || end != v.size() || stage < 0 || stage > 3)
             MEMFIT_THROW(ConfigError, "config", "--zero must be 0, 1, 2, 3 or auto, got '{}'", v);
           c.zero = stage;
         },
         "ZeRO stage under mpirun or srun (default 0, every rank holds everything): 1, 2 and 3 "
         "shard the optimizer state, then the gradients, then the weights; auto, with "
         "--mem-limit, the fastest that fits. Note [ZeRO] (docs/notes/zero.md)")
      ->type_name("STAGE|auto");
  cmd->add_option("--tp", c.tp,
                  "Tensor parallelism under mpirun or srun: split each block's matrices, the "
                  "embedding and the LM head over this many neighbouring ranks (Megatron's "
                  "layout; it must divide the ranks, heads and MLP width, and divide the key/value "
                  "heads or be a multiple of them); the data group is the ranks / tp (/ pp: with "
                  "--pp each stage is a tensor group). fp32, bf16, fp16 or fp8, ZeRO 0-3 on "
                  "the data group, every --ckpt policy; AdamW, SGD, Lion, Adam-mini, and 8-bit "
                  "AdamW or Lion and 4-bit AdamW where the slices cut whole blocks; saves whole "
                  "tensors that load at any layout. "
                  "Note [Tensor parallel] (docs/notes/tensor-parallel.md)")
      ->capture_default_str();
  cmd->add_flag("--sp", c.sp,
                "Sequence parallelism with --tp (Megatron's, Korthikanti et al. 2022): the "
                "residual stream, the norms and their statistics hold 1/tp of the tokens on each "
                "tensor rank; all-gathers before and reduce-scatters after the split linears "
                "replace the all-reduces. --seq-len must divide by --tp. Note [Sequence "
                "parallel] (docs/notes/tensor-parallel.md)");
  cmd->add_option("--tp-overlap", c.tp_overlap,
                  "With --tp: on runs each column-parallel layer's input-gradient all-reduce "
                  "(reduce-scatter with --sp) on a communication thread per rank while the "
                  "weight-gradient GEMM computes (MPI initialised SERIALIZED); the same bits as "
                  "off. It takes a core from the GEMM while it copies: measured in Note [Tensor "
                  "parallel], \"Overlap\" (docs/notes/tensor-parallel.md)")
      ->type_name("on|off")
      ->capture_default_str();
  cmd->add_option("--pp", c.pp,
                  "Pipeline parallelism under mpirun or srun: cut the model into this many "
                  "stages of contiguous blocks, one a rank (the embeddings on the first, the "
                  "final norm and LM head on the last), each holding its own parameters, "
                  "gradients and optimizer state alone; the micro-batches are --grad-accum's. "
                  "The data group is the ranks / (pp x tp): with --tp (and --sp) each stage is a "
                  "tensor group. fp32, bf16, fp16 or fp8, ZeRO 0-3 and --grad-dtype bf16 on each "
                  "stage's data group, every --optim, --act-compress; a tied head (GPT-2, or LLaMA's "
                  "--tie-embeddings true) as a copy of the table on the last stage; saves whole tensors "
                  "that load at any layout. Note [Pipeline parallel] "
                  "(docs/notes/pipeline-parallel.md)")
      ->capture_default_str();
  cmd->add_option("--pp-layers", c.pp_layers,
                  "With --pp: each stage's block count, e.g. 5,7 (summing to the layers), or "
                  "auto: the cut that balances the stages' estimated step times (the first "
                  "stage carries the embeddings, the last the LM head), or their memory where "
                  "that cut does not fit --mem-limit; cuts fall between --ckpt segments")
      ->capture_default_str();
  cmd->add_option("--pp-schedule", c.pp_schedule,
                  "With --pp: gpipe (every forward, then every backward: each stage keeps every "
                  "micro-batch's input) or 1f1b (one forward, one backward: stage s keeps at most "
                  "pp - s); both give one process's bits with the same --grad-accum; or "
                  "interleaved (Megatron's interleaved 1F1B over --pp-virtual chunks a rank: a "
                  "bubble --pp-virtual times smaller, more inputs kept; --grad-accum a multiple "
                  "of --pp; fp32, bf16, fp16 or fp8, every --optim, --act-compress, "
                  "--lora-rank, ZeRO 0-3, --tp), also one process's bits")
      ->capture_default_str();
  cmd->add_option("--pp-virtual", c.pp_virtual,
                  "With --pp-schedule interleaved: chunks a rank (virtual stages), 2 or more; "
                  "the blocks are cut into --pp x --pp-virtual chunks, rank r holding chunks r, "
                  "r + pp, ... (--pp-layers gives each chunk's count; auto balances the "
                  "chunks)")
      ->capture_default_str();
  cmd->add_option("--link", c.links,
                  "A link the step-time estimate prices transfers on, repeatable: intra=BW,LAT "
                  "(within a node) or inter=BW,LAT (between nodes), BW in GB/s (or with GB/s, "
                  "GiB/s, Gb/s), LAT in microseconds (or with ns, us, ms), e.g. "
                  "inter=25GB/s,5us. Defaults: intra this host's measured copy rate, 1 us; inter "
                  "25 GB/s, 5 us, an InfiniBand HDR-like estimate. A model, not a measurement "
                  "(Note [Step-time model], docs/notes/planner.md)");
  cmd->add_option("--ranks-per-node", c.ranks_per_node,
                  "Ranks on each node for the step-time estimate (rank r on node r / N): a "
                  "collective or pipeline transfer whose ranks span two nodes is priced on "
                  "--link inter (0: every rank on one node)")
      ->capture_default_str();
  cmd->add_option("--prefetch-depth", c.prefetch_depth,
                  "ZeRO stage 3 (or --offload-params nvme): blocks gathered (read) ahead of the "
                  "one computing (0: none)")
      ->capture_default_str();
  cmd->add_option("--persist-threshold", c.persist_threshold,
                  "ZeRO stage 3 (or --offload-params nvme): blocks of fewer elements are kept "
                  "whole (in RAM), gathered (read) once per update")
      ->capture_default_str();
  cmd->add_flag("--sync-every-micro-batch", c.sync_every_micro_batch,
               "Under mpirun or srun, stages 0-1 with --grad-accum above 1: reduce every "
               "micro-batch's gradients as stages 2-3 do, so every stage sums bit for bit alike");
  cmd->add_option("--grad-dtype", c.grad_dtype,
                  "The summed gradients' type, kept and reduced: fp32, or bf16 (half the bytes "
                  "held and moved; each block's gradients still computed in f32)")
      ->check(CLI::IsMember({"fp32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--collective-timeout", c.collective_timeout,
                  "Under mpirun or srun: seconds a rank waits for one collective before the job "
                  "fails, naming it (0: forever); keep it above the longest save")
      ->capture_default_str();
}

// The budget and where the state lives: --mem-limit, offload, the micro-batch search.
void add_memory_options(CLI::App* cmd, TrainConfig& c) {
  cmd->add_option("--mem-limit", c.mem_limit, "Memory budget, e.g. 2GiB (default: none)");
  cmd->add_option("--offload-optimizer", c.offload_optimizer,
                  "none | nvme: the optimizer state and FP32 master weights in files in "
                  "--offload-dir, streamed through each update, bit-identical to RAM. Note [NVMe "
                  "offload] (docs/notes/offload.md)")
      ->capture_default_str();
  cmd->add_option("--offload-params", c.offload_params,
                  "none | nvme: the blocks' working weights in a file in --offload-dir, each "
                  "block read before it computes; needs --offload-optimizer nvme (and --zero 3 "
                  "under mpirun); with --lora-rank it alone keeps the frozen base on disk, read "
                  "only. Note [NVMe offload], \"Working weights on disk\"")
      ->capture_default_str();
  cmd->add_option("--offload-grads", c.offload_grads,
                  "none | nvme: no gradient slab in RAM, each block's gradients written to a "
                  "file in --offload-dir as its backward ends; one process, with "
                  "--offload-optimizer nvme. Note [NVMe offload], \"Gradients on disk\"")
      ->capture_default_str();
  cmd->add_option("--offload-dir", c.offload_dir,
                  "Directory for the offload files (scratch, removed when the run ends)");
  cmd->add_option("--disk-limit", c.disk_limit,
                  "With --offload-optimizer nvme: the most disk the offload files may take, e.g. "
                  "100GiB (default: the free space of --offload-dir)");
  cmd->add_flag("--auto-batch", c.auto_batch,
                "With --mem-limit: choose the micro-batch (a divisor of --batch x --grad-accum, "
                "which stays) that fits fastest");
}

// Evaluation, checkpoints, the log and the data order.
void add_run_options(CLI::App* cmd, TrainConfig& c) {
  cmd->add_option("--eval-every", c.eval_every, "Steps between evaluations (0: at the end)")
      ->capture_default_str();
  cmd->add_option("--eval-batches", c.eval_batches, "Validation micro-batches per evaluation")
      ->capture_default_str();
  cmd->add_option("--save", c.save_dir, "Checkpoint directory (written atomically)");
  cmd->add_option("--save-every", c.save_every, "Steps between checkpoints (0: at the end)")
      ->capture_default_str();
  cmd->add_option("--save-every-minutes", c.save_every_minutes,
                  "Also save when this many minutes have passed since the last save (0: off)")
      ->capture_default_str();
  cmd->add_option("--max-shard-size", c.max_shard_size,
                  "Checkpoint weights above this are sharded, as Hugging Face does (5GB = 5e9 "
                  "bytes, 2GiB = 2^31)")
      ->capture_default_str();
  cmd->add_option("--resume", c.resume_dir, "Continue a run from its checkpoint");
  cmd->add_option("--init-from", c.init_from,
                  "Start from these weights (a memfit or Hugging Face GPT-2 / LLaMA directory)");
  cmd->add_option("--log", c.log_file,
                  "JSON-lines log, one line per step; its curves are drawn at the end beside it "
                  "(FILE with .curves.html for its extension)");
  cmd->add_option("--shuffle", c.shuffle, "Visit windows in a seeded random order")
      ->capture_default_str();
  cmd->add_flag("--repeat-batch", c.repeat_batch,
                "Train every step on the same micro-batches (the first step's): the loss on one "
                "fixed batch must fall");
}

// The step's activations and precision.
void add_step_options(CLI::App* cmd, TrainConfig& c) {
  cmd->add_option("--attention", c.attention,
                  "flash (tiled, O(T) saved per head) | plain (saves the T x T probabilities)")
      ->capture_default_str();
  cmd->add_option("--lm-head-group", c.lm_head_group,
                  "Rows of the LM head's gradient per weight-gradient GEMM where bf16 matmuls "
                  "run in oneDNN (0: 512), 2 x vocab bytes each. Note [Fused LM head] "
                  "(docs/notes/fused-lm-head.md)")
      ->capture_default_str();
  cmd->add_option("--ckpt", c.ckpt,
                  "Activation checkpointing: none | full | selective | every:K | layers:LIST | "
                  "auto (the fastest that fits --mem-limit)")
      ->capture_default_str();
  cmd->add_option("--act-compress", c.act_compress,
                  "none | int8 | fp8: the saved activations at one byte a value (0.57x the "
                  "bytes); not given, --ckpt auto may choose int8. Note [Activation compression] "
                  "(docs/notes/activation-compression.md)");
  cmd->add_option("--precision", c.precision,
                  "fp32 | bf16 (bf16 matmuls, FP32 master weights) | fp16 (loss scaling) | fp8 (bf16 "
                  "with the blocks' linears on FP8 E4M3/E5M2 operands: FP8's numerics, bf16's "
                  "speed; Note [FP8], docs/notes/fp8.md) | auto (bf16 where the CPU multiplies "
                  "bf16 natively, else fp32). Note [Mixed precision] "
                  "(docs/notes/mixed-precision.md)")
      ->capture_default_str();
  cmd->add_option("--master-weights", c.master_weights,
                  "fp32 | none (bf16 only: pure bf16 weights, stochastic rounding)")
      ->capture_default_str();
  cmd->add_option("--loss-scale-window", c.loss_scaler.window,
                  "fp16: clean steps before the loss scale doubles")
      ->capture_default_str();
  cmd->add_option("--hysteresis", c.loss_scaler.hysteresis,
                  "fp16: overflowing steps before the loss scale halves")
      ->capture_default_str();
  cmd->add_option("--min-loss-scale", c.loss_scaler.min_scale, "fp16: floor of the loss scale")
      ->capture_default_str();
  cmd->add_option("--initial-loss-scale", c.loss_scaler.initial_scale,
                  "fp16: the loss scale at the start")
      ->capture_default_str();
}

// Stopping early, the memory profile and the leak check.
void add_profile_options(CLI::App* cmd, TrainConfig& c) {
  cmd->add_option("--stop-after", c.stop_after,
                  "Stop after this step as if interrupted (the schedule still spans --steps)");
  cmd->add_option("--profile", c.profile_dir,
                  "Write a memory profile of the first --profile-steps steps to this directory: "
                  "trace.json, memory.html, summary.json (DIR/rank<r>/ under MPI; "
                  "docs/profiling.md)");
  cmd->add_option("--profile-steps", c.profile_steps, "Steps the profile covers")
      ->capture_default_str();
  cmd->add_flag("--fail-on-leak", c.fail_on_leak,
                "Exit with 4 when the pool's live bytes grew between step boundaries after the "
                "first step");
  // The tests' deliberate leak (options/train_config.h); hidden from --help.
  cmd->add_option("--test-leak-bytes", c.test_leak_bytes)->group("");
}

}  // namespace

void add_train_options(CLI::App* cmd, TrainConfig& c, std::string& config_file) {
  cmd->add_option("--config", config_file, "TOML file of options (keys are option names)");
  add_model_options(cmd, c);
  add_schedule_options(cmd, c);
  add_parallel_options(cmd, c);
  add_memory_options(cmd, c);
  add_run_options(cmd, c);
  add_step_options(cmd, c);
  add_profile_options(cmd, c);
}

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a GPT-2 or LLaMA-family model on token shards "
                                           "(from scratch, from --init-from weights, or --resume "
                                           "a run)");
  auto cfg = std::make_shared<TrainConfig>();
  auto config_file = std::make_shared<std::string>();
  add_train_options(cmd, *cfg, *config_file);
  // train runs as the ranks its launcher starts; --ranks and --world-size are plan's. Taken here
  // (hidden) only to say how to start ranks instead of "not expected".
  auto ranks = std::make_shared<int>(0);
  cmd->add_option("--ranks,--world-size", *ranks)->group("");
  cmd->callback([cmd, cfg, config_file, ranks] {
    if (cmd->get_option("--ranks")->count() > 0)
      MEMFIT_THROW(ConfigError, "config",
                   "memfit train starts no ranks itself: launch {} ranks with `mpirun -n {} "
                   "memfit train ...` (or `srun -n {}`), each taking its rank and the world size "
                   "from the launcher; --ranks and --world-size are memfit plan's, to plan such a "
                   "run{}",
                   *ranks, *ranks, *ranks,
                   dist::built_with_mpi()
                       ? ""
                       : ". This memfit was built without MPI: install libopenmpi-dev and rebuild "
                         "(scripts/setup.sh does)");
    if (!config_file->empty()) apply_toml_config(*cmd, *config_file);
    // One process, or one of the ranks mpirun or srun started, in a grid of data parallelism
    // only (dist/process_grid.h); the world's rank 0 speaks.
    // --tp-overlap on: the tensor group's communication thread calls MPI too (SERIALIZED).
    std::unique_ptr<dist::Communicator> world =
        dist::make_world_communicator(parse_tp_overlap(cfg->tp_overlap));
    world->set_timeout(cfg->collective_timeout);
    const int world_size = world->size();
    // --tp: neighbouring ranks split each layer (tensor fastest: Note [Process grid]). Every rank
    // must make the same grid (the splits are collective), so they agree on it first.
    if (world_size > 1)
      dist::check_ranks_agree(*world, {{"--tp", std::to_string(cfg->tp)},
                                       {"--sp", cfg->sp ? "on" : "off"},
                                       {"--tp-overlap", cfg->tp_overlap},
                                       {"--pp", std::to_string(cfg->pp)}});
    if (cfg->tp < 1 || world_size % cfg->tp != 0)
      MEMFIT_THROW(ConfigError, "config",
                   "--tp {} must divide the ranks the launcher started ({}): each tensor group "
                   "is --tp neighbouring ranks, the data group the rest",
                   cfg->tp, world_size);
    if (cfg->pp < 1 || (world_size / cfg->tp) % cfg->pp != 0)
      MEMFIT_THROW(ConfigError, "config",
                   "--pp {} must divide the ranks the launcher started ({}{}): each pipeline "
                   "group is --pp ranks, one a stage, the data group the rest",
                   cfg->pp, world_size,
                   cfg->tp > 1 ? fmt::format(" / --tp {}", cfg->tp) : std::string());
    dist::ProcessGrid grid(std::move(world),
                           dist::GridShape{.data = world_size / (cfg->tp * cfg->pp),
                                           .pipeline = cfg->pp,
                                           .tensor = cfg->tp});
    const bool lead = grid.world().rank() == 0;
    cfg->ranks = grid.world().size();
    // The checkpoint the run starts from, read once for every step below
    // (options/resolve_train_spec.h).
    StartingCheckpoint start(*cfg);
    // The preset's published learning rate and warmup, where the options leave them open.
    auto given = [&](const char* name) { return cmd->get_option(name)->count() > 0; };
    adopt_lora_from(*cfg, start.model().config,
                    {given("--lora-rank"), given("--lora-alpha"), given("--lora-targets")});
    const std::string preset_line = apply_preset_schedule(
        *cfg, {given("--lr"), given("--warmup"), given("--min-lr")}, &start);
    if (lead && !preset_line.empty()) fmt::print("memfit: {}\n", preset_line);
    const std::string attention_line =
        fp16_attention_default(*cfg, cmd->get_option("--attention")->count() > 0);
    if (lead && !attention_line.empty()) fmt::print(stderr, "memfit: {}\n", attention_line);
    // The options resolved once into the typed run train() takes (strings stay here). Nothing
    // fitting is an OutOfMemoryError that already carries the planner's advice.
    AutoResolution run = resolve_auto(*cfg, start);
    adopt_lead_choice(run, grid.world());  // ranks whose calibrations differ still agree
    const TrainSpec& spec = run.train;
    if (lead) {
      if (grid.data().size() > 1)
        fmt::print("memfit: data parallel over {} ({} rows a micro-batch on each)\n",
                   grid.data().describe(), spec.run.batch);
      if (spec.run.pp() > 1)
        fmt::print("memfit: pipeline of {} stages (blocks {}), --pp-schedule {}, {} "
                   "micro-batches a step{}\n",
                   spec.run.pp(), describe_stages(spec.run.pipeline),
                   pipe_schedule_label(spec.run), spec.run.grad_accum,
                   run.pipeline_note.empty() ? std::string() : "\nmemfit: " + run.pipeline_note);
      print_precision_route(spec.run.precision.precision, run.precision_note);
      if (run.planned) print_search(run.search, run.note);
    }
    TrainSummary summary;
    try {
      summary = train(spec, grid);
    } catch (const OutOfMemoryError& e) {
      if (spec.run.pp() > 1) throw;  // the advice plans one model whole, not its stages
      throw with_fit_advice(e, spec.run);
    }
    grid.world().end();  // MEMFIT_CHECK_COLLECTIVES: no rank issues collectives past this point
    // Each rank checks its own step boundaries; the lead prints, another rank only a leak.
    const bool leaked = summary.leak.leaked();
    if (!lead) {
      if (leaked) fmt::print(stderr, "memfit: rank {}: {}", summary.rank, summary.leak.text());
      if (leaked && spec.fail_on_leak && !summary.interrupted_by) throw ExitCode{4};
      return;
    }
    print_summary(summary);
    if (run.planned && run.search.fits) print_planned_peak(run.search, summary, grid.data().size());
    if (!summary.profile_text.empty()) fmt::print("\n{}", summary.profile_text);
    if (!spec.log_file.empty()) print_curves(spec.log_file);
    std::fflush(stdout);
    if (leaked || !spec.profile_dir.empty() || spec.fail_on_leak)
      fmt::print(leaked ? stderr : stdout, "\n{}{}", leaked ? "memfit: " : "", summary.leak.text());
    if (summary.interrupted_by) {
      fmt::print(stderr, "memfit: stopped by {} after step {}; ", signal_name(summary.interrupted_by),
                 summary.last_step);
      if (summary.saved)
        fmt::print(stderr,
                   "saved to {}. To continue: the same command with --resume {} (and no "
                   "--init-from)\n",
                   spec.save_dir, spec.save_dir);
      else
        fmt::print(stderr, "nothing saved (no --save given)\n");
      std::fflush(stdout);
      throw ExitCode{128 + summary.interrupted_by};
    }
    if (leaked && spec.fail_on_leak) {
      std::fflush(stdout);
      throw ExitCode{4};
    }
  });
}

}  // namespace memfit::cli
