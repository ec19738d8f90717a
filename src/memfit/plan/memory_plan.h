// The planner: what a `memfit train` run will allocate, by category, before anything is
// allocated. It reads the same lists the engine allocates from: the parameter layout (params,
// master, grads), the optimizer's state_bytes_for (optimizer), the step plan (activations and
// workspace: their arenas, model/step_plan.h) and the data loaders' staging_bytes (staging). The
// engine allocates all of these before the first step and a step allocates nothing more, so the
// prediction is the measured peak (tests/plan/memory_plan_test.cpp checks it byte for byte).
// Within the step, buffers live in phases; the phase where the most bytes are live is the one
// reported as the peak's moment (docs/notes/planner.md, Note [Step arena]).
#pragma once

#include <deque>
#include <functional>
#include <string>
#include <vector>

#include "memfit/dist/comm_volume.h"
#include "memfit/memory/category.h"
#include "memfit/model/step_plan.h"
#include "memfit/plan/step_time.h"
#include "memfit/plan/run_spec.h"

namespace memfit {

struct PlanReport {
  ModelConfig model;
  int B = 0, T = 0;
  CategoryBytes by_category{};  // at the peak: what the pool holds (activations, workspace: arenas)
  // A quantized base (--base-dtype nf4 or int8): the buffer of the blocks' linear weights, part
  // of params.
  size_t quant_base_bytes = 0;
  size_t peak_bytes = 0;
  std::string peak_phase;       // where the most bytes are live: "backward of block 11"
  size_t peak_live_bytes = 0;   // live then: the other categories and that phase's buffers
  StepPlan step;                // buffers, lifetimes, arenas and live bytes per phase
  double flops = 0;             // per optimizer step, recomputation included
  double recompute_flops = 0;   // of which recomputation
  double est_step_seconds = 0;  // step_time.total()
  StepTime step_time;           // the estimate by part, from this CPU's calibration
  // Whether training shards were found: staging is then exact. Without them it counts the
  // train and val loaders' fixed buffers, not the shuffle's permutation (4 bytes a window).
  bool data_included = false;
  // --offload-optimizer nvme: the offload files' bytes by category (master, optimizer), which
  // are then not in by_category, and the bytes read plus written by one optimizer step. The
  // staging ring the update streams through is in by_category (staging).
  CategoryBytes disk_by_category{};
  uint64_t disk_bytes = 0;
  uint64_t io_bytes_per_step = 0;
  size_t offload_staging_bytes = 0;  // the ring's part of staging
  // --offload-params nvme: the working weights' file (in disk_by_category's params, and in
  // disk_bytes), its part of io_bytes_per_step (the micro-batches' block reads, the update's
  // write-back, and its reads without master weights), and the ring of prefetch_depth + 1
  // block slots (in staging). by_category's params is then the persistent units alone.
  uint64_t param_read_bytes = 0, param_written_bytes = 0;
  size_t param_ring_bytes = 0;
  // Several ranks: the bytes a step's collectives cover (the same on every rank; stage 3's
  // gathers follow the step plan's phases), what the log's comm_bytes measures and the
  // step-time model prices.
  dist::CommVolume comm_per_step;
};

// Step plans by all they depend on: the model, B, T, the activation options and OpenMP's thread
// count (the kernels' scratch is per thread). A search plans candidates that differ only in
// what the step plan does not read (where the optimizer, the weights and the gradients live,
// the ZeRO stage), one after another, and plan_step was most of each (perf: 76% of a
// `plan --max-model` search at llama2-7b). The last kKept plans are kept: a search's innermost
// loops ask for at most four (with and without the gradients in the arena, in f32 and in bf16
// where the precision levers are swept).
class StepPlanCache {
 public:
  static constexpr size_t kKept = 4;
  // plan_step's plan for these, made now or kept from an earlier call. The reference holds
  // until the next call.
  const StepPlan& plan(const ModelConfig& model, int B, int T, const ActivationOptions& options);
  size_t made() const { return made_; }  // how many plans were made, not found

 private:
  struct Entry {
    ModelConfig model;
    int B, T, threads;
    ActivationOptions options;
    StepPlan step;
  };
  std::deque<Entry> kept_;  // the most recently made last
  size_t made_ = 0;
};

// Plans a run as `train` makes it: with spec.world data-parallel ranks at ZeRO stage spec.zero,
// what rank `rank` holds (ranks differ by their shard's and receive buffer's bytes). Throws
// ConfigError as spec.check() does.
// `steps`, if given, supplies the step plan (a search's cache).
PlanReport plan_training(const RunSpec& spec, int rank = 0, StepPlanCache* steps = nullptr);
// The memory half of plan_training alone (flops and step time left 0): no calibration is read
// or measured. The profiler draws it beside what it measures.
PlanReport plan_memory(const RunSpec& spec, int rank = 0, StepPlanCache* steps = nullptr);
// plan_memory of every rank, each handed to `visit` in rank order (the shards and the step plan
// made once, not once a rank).
void plan_every_rank(const RunSpec& spec,
                     const std::function<void(int rank, const PlanReport&)>& visit);
// plan_memory of the rank whose peak is the largest (the first of equals; `rank`, if given,
// gets which): what a per-rank budget (each rank's --mem-limit) must hold. With one rank,
// rank 0's. `disk_bytes`, if given, gets the largest offload files of any rank (0 without
// offload): what a per-rank --disk-limit must hold.
PlanReport plan_largest_rank(const RunSpec& spec, int* rank = nullptr,
                             uint64_t* disk_bytes = nullptr, StepPlanCache* steps = nullptr);

// The set-up's staging piece (Transformer::set_weights: the initial weights drawn, or a
// checkpoint read, into the working copy where it is not the f32 weights of record), in f32
// elements: at most Transformer::kDefaultPieceElements (4 MiB) and at most the step's
// activation arena. The set-up holds the run's other categories but not the step's arenas,
// the data loaders' staging or the gradient exchange's ring, so with the piece no larger than
// the activation arena it never holds more than the step will: the run's peak stays the step's
// and the plan needs no set-up term (Note [Set-up by range] in docs/notes/zero.md;
// PlanVsMeasured.SetUpPieceStaysUnderTheStep checks it).
int64_t setup_piece_elements(const StepPlan& step);

// Whether a save streams model.safetensors from the offload files (Note [Streamed save] in
// docs/notes/checkpoints.md): one process whose weights of record are on disk, the offloaded
// master weights, or without master weights (fp32, pure bf16) the offloaded working weights.
bool save_streams_weights(const RunSpec& spec);
// The streamed save's staging, in f32 elements (the trainer allocates it, Category::staging,
// for the save's duration; plan_memory counts it for a run that saves): the tiles of the
// tensors stored transposed (GPT-2's Conv1D weights) pass through it. As the set-up's piece,
// at most 4 MiB and at most the step's activation arena (setup_piece_elements), so a save
// adds little to the run's peak; 0 where the save does not stream or the family stores
// nothing transposed (LLaMA: the runs are written straight from the offload ring). A split
// layout's save (--tp, --pp: every rank writes its slices into whole tensors, Note
// [Checkpoints across layouts]) takes the same on every rank.
int64_t save_staging_elements(const RunSpec& spec, const StepPlan& step);
// A quantized base's save: the staging its linears are dequantized into on their way to
// model.safetensors ("save.quant", f32-sized elements: setup_piece_elements), else 0.
int64_t save_quant_staging_elements(const RunSpec& spec, const StepPlan& step);

// The FLOPs of one micro-batch's forward and backward (matmuls and attention scores; the
// elementwise work is not counted), with the recomputation the checkpoint policy adds; `head`
// is the LM head's share of `total`. Under LoRA (options.lora_rank > 0) the frozen matrices'
// backward computes d(input) alone: no weight-gradient GEMM, so a linear costs twice its
// forward, not three times (the adapters' own FLOPs, rank r against widths in the thousands,
// are left out).
struct StepFlops {
  double total = 0, recompute = 0, head = 0;
};
StepFlops step_flops(const ModelConfig& c, int B, int T, const ActivationOptions& options);

}  // namespace memfit
