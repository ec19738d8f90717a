#include "memfit/plan/memory_plan.h"

#include "memfit/model/fp8_weights.h"
#include "memfit/model/quant_base.h"

#include "memfit/model/transformer.h"

#include <algorithm>
#include <filesystem>
#include <optional>

#include <omp.h>

#include "memfit/core/scoped_threads.h"
#include "memfit/dist/communicator_tensor_group.h"
#include "memfit/dist/comm_volume.h"
#include "memfit/dist/zero/fp8_publish.h"
#include "memfit/dist/grad_sync.h"
#include "memfit/dist/pipeline_runner.h"
#include "memfit/dist/process_grid.h"
#include "memfit/dist/tied_gradient.h"
#include "memfit/io/data/data_loader.h"
#include "memfit/io/data/loss_mask.h"
#include "memfit/io/hf/model_weights.h"
#include "memfit/io/checkpoint/streamed_weights.h"
#include "memfit/memory/pool.h"
#include "memfit/model/layout_map.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/stage_offsets.h"
#include "memfit/dist/zero/unit_grads.h"
#include "memfit/offload/offloaded_grads.h"
#include "memfit/dist/zero/weight_gather.h"
#include "memfit/offload/disk_rate.h"
#include "memfit/offload/offload_layout.h"
#include "memfit/offload/param_file.h"
#include "memfit/optim/backward_update.h"
#include "memfit/optim/optimizer.h"
#include "memfit/plan/calibration.h"
#include "memfit/plan/tensor_comm.h"
#include "memfit/state/state_placement.h"

namespace memfit {

StepFlops step_flops(const ModelConfig& c, int B, int T, const ActivationOptions& options) {
  const double N = double(B) * T, C = c.d_model;
  // qkv, attention out, fc, MLP out (GPT-2: 3C^2 + C^2 + 4C^2 + 4C^2 = 12C^2).
  const double block_matmul = 2.0 * N * double(c.block_matmul_params());
  // QK^T and PV, causal half, per block (query heads: grouped-query attention shares keys and
  // values, not work).
  const double scores = 2.0 * double(B) * T * T * double(c.attn_width());
  const double head = 2.0 * N * C * double(c.local_vocab());  // the rank's rows under --tp
  // Backward costs twice the forward (d(input) and d(weight)), once under LoRA (the base is
  // frozen: d(input) alone); flash attention's backward also recomputes the scores.
  const double passes = options.lora_rank > 0 ? 2.0 : 3.0;
  const bool flash = options.attention == AttentionKind::flash;
  const double block = passes * block_matmul + (flash ? 4.0 : 3.0) * scores;
  StepFlops f;
  // A pipeline stage (ModelConfig::stage): its blocks, and the head on the last stage.
  const int first = c.pipelined() ? c.stage.first : 0;
  const int last = c.pipelined() ? c.stage.last : c.n_layer;
  const bool has_head = !c.pipelined() || c.stage.has_head();
  f.head = has_head ? passes * head : 0.0;
  f.total = (last - first) * block + f.head;
  const BlockSlots slots = block_slots(options.ckpt, c.n_layer);
  for (int l = first; l < last; ++l)
    if (slots.slot[static_cast<size_t>(l)] >= 0)
      f.recompute += block_matmul + scores;  // the block's forward again
  if (options.ckpt.selective() && !flash) f.recompute += (last - first) * scores;
  f.total += f.recompute;
  return f;
}

namespace {

namespace fs = std::filesystem;

// What differs between ranks, into `bytes`, read from the rank's placement (Note [State
// placement], the object train() builds its state from): ZeRO (Note [ZeRO]) from stage 1 on
// keeps the optimizer state and master weights of the rank's shard alone, stage 2 its summed
// gradients too (with the gradient unit buffers: dist/zero/unit_grads.h), stage 3 its working
// weights too, and data parallelism adds the ring of receive buffers the gradient buckets are
// summed through (dist/grad_sync.h; from stage 2 a reduce-scatter's, sized by this rank's part
// of a bucket), plus stage 3's gather buffers.
// plan_memory and plan_largest_rank both count them here: whatever a stage makes differ between
// ranks belongs here (ZeroSearch.TheLargestRankIsTheLargestOfEveryRanksPlan checks it).
// With the optimizer offloaded, the state and the master weights go to files: the rank's
// offload layout is returned (its ring, files and I/O; `master` and `optimizer` are then 0
// here), and the caller adds the ring to staging.
std::optional<offload::OffloadLayout> rank_bytes(const RunSpec& spec, const ParamLayout& layout,
                                                 const OptimConfig& oc,
                                                 const StatePlacement& placement,
                                                 CategoryBytes& bytes) {
  auto at = [&](Category c) -> size_t& { return bytes[static_cast<size_t>(c)]; };
  const int rank = placement.rank();
  const DType half = half_dtype(spec.precision.precision);
  const std::optional<ElementRange> mine = placement.owned();
  // (An empty shard, a tiny model over many ranks, still allocates the pool's smallest block.)
  auto shard_or_whole = [&](DType dt) {
    return MemoryPool::round_up(std::max<size_t>(
        1, static_cast<size_t>(mine ? mine->size() : layout.total()) * dtype_size(dt)));
  };
  // Stage 3: the working weights of the shard alone (Note [ZeRO stage 3]; a frozen LoRA base
  // too, whose optimizer state is not sharded).
  at(Category::params) =
      placement.params_gathered()
          ? MemoryPool::round_up(std::max<size_t>(
                1, static_cast<size_t>(placement.my_shard().size()) * dtype_size(half)))
          : MemoryPool::round_up(static_cast<size_t>(layout.total()) * dtype_size(half));
  // --precision fp8's stored weights (Note [FP8], "Storage"): the working slab without the
  // blocks' linears, and their codes and scales ("params.fp8"), as Transformer allocates them.
  if (placement.params_fp8()) {
    int64_t compact = 0;
    (void)layout.compact_offsets(&compact);
    at(Category::params) =
        MemoryPool::round_up(static_cast<size_t>(compact) * dtype_size(half)) +
        MemoryPool::round_up(Fp8WeightLayout(layout).bytes());
  }
  if (placement.master().where != Residence::none)
    at(Category::master) = shard_or_whole(DType::f32);
  at(Category::optimizer) = optimizer_state_bytes(oc, layout, mine);
  // The gradients' exchange: the whole slab's buckets through a receive ring, or per unit (Note
  // [Sharded gradients]) the unit buffers and their receive ring (dist/zero/unit_grads.h).
  // Stages 2-3 hold their shard's summed gradients alone (else the whole slab: plan_memory).
  // bf16 gradients (--grad-dtype bf16) are per unit at every stage and in one process (one
  // shard, the whole layout), the accumulator bf16 (Note [Gradients in bf16]).
  const std::vector<ElementRange>& unit_shards = placement.grad_shards();
  if (placement.grads_own_accumulator())
    at(Category::grads) = UnitGrads::grads_bytes(layout, unit_shards, rank,
                                                 placement.grads_whole(), spec.grad_dtype);
  // --update-in-backward: the unit buffers the fused update steps from, no slab (Note [Update
  // in backward]; optim/backward_update.h's own arithmetic).
  // At stages 2-3 the per-unit reduction's buffers (comm, below) and no accumulator.
  if (placement.grads_in_backward())
    at(Category::grads) =
        placement.grads_per_unit() ? 0 : BackwardUpdate::grads_bytes(layout);
  if (placement.grads_per_unit())
    at(Category::comm) = UnitGrads::comm_bytes(layout, spec.bucket_bytes, unit_shards, rank,
                                               placement.grads_whole(), spec.grad_dtype);
  else
    at(Category::comm) =
        dist::GradientSync::comm_bytes(layout.total(), spec.bucket_bytes, spec.world, rank);
  // Stage 3: the gathered units' buffers (dist/zero/weight_gather.h, what the engine allocates).
  if (placement.params_gathered())
    at(Category::comm) += WeightGather::comm_bytes(layout, half, placement.prefetch_depth(),
                                                   placement.persist_threshold());
  // --offload-params: in one process RAM holds the persistent units instead of the slab (the
  // ring is staging: plan_rank adds it); at stage 3 no working shard, and a landing buffer
  // for the rank's part of a block beside the gathered units' buffers (offload/param_file.h and
  // dist/zero/weight_gather.h are the engine's own arithmetic). LoRA's frozen base is the one
  // file with the optimizer in RAM (Note [LoRA], "The frozen base on disk").
  if (placement.params_in_file()) {
    const UnitFileRam ram =
        WeightGather::file_ram_bytes(layout, half, placement.prefetch_depth(),
                                     placement.persist_threshold(), placement.params_file_range());
    at(Category::params) = ram.params;
    at(Category::comm) += ram.comm;
  }
  if (!placement.optimizer_in_file()) return std::nullopt;
  // The state and the master weights go to files; RAM holds the ring that streams them
  // (offload/offload_layout.h, the engine's own computation). Under ZeRO (stages 1 to 3) this
  // rank's shard alone: its files, its ring, its I/O. At stage 3 the ring is beside the
  // gathered units' buffers (comm, above): the update streams pieces while the persistent units
  // are held, and both are allocated for the whole run.
  offload::OffloadLayout files = offload::make_offload_layout(
      layout, oc, at(Category::master) > 0, offload::kMaxPieceElements, mine);
  at(Category::master) = 0;
  // In RAM only the update's scratch, shared by the pieces (APOLLO; 0 for the others).
  at(Category::optimizer) = optimizer_scratch_bytes(oc, layout);
  return files;
}

// What plan_memory computes the same for every rank: the shards (in rank 0's placement) and
// the step plan. Made once for a listing of every rank (plan_every_rank), where W of each made
// it quadratic in W.
struct SharedPlan {
  StatePlacement placement;
  StepPlan step;
};

// The tied table's gradient a pipeline's first and last stages sum: none for LoRA's frozen
// table (Note [LoRA], "Under --pp").
int64_t tied_gradient_floats(const RunSpec& spec, const ModelConfig& model,
                             const ParamLayout& layout) {
  return spec.lora.enabled() ? 0 : tied_table(model, layout).size();
}

// LoRA (Note [LoRA]): the base weights as rank_bytes counted them, no base gradients or optimizer
// state; the adapters' f32 weights and gradients, and the optimizer's state over their layout.
void add_lora_bytes(const RunSpec& spec, int rank, const ParamLayout& layout,
                    const OptimConfig& oc, const StatePlacement& placement, PlanReport& r) {
  auto at = [&](Category c) -> size_t& { return r.by_category[static_cast<size_t>(c)]; };
  const PrecisionOptions precision = spec.precision;
  const LoraLayout lora(r.model, spec.lora);
  const size_t adapters =
      MemoryPool::round_up(static_cast<size_t>(lora.total()) * sizeof(float));
  // A quantized base (Note [NF4 weights], "QLoRA"; Note [Int8 weights]): the working slab
  // without the blocks' linears, and their buffer ("base.nf4", "base.int8"), as Transformer
  // allocates them.
  if (const auto quant = spec.lora.base_quant()) {
    int64_t compact = 0;
    (void)layout.compact_offsets(&compact);
    r.quant_base_bytes = MemoryPool::round_up(QuantBaseLayout(r.model, *quant).bytes());
    at(Category::params) =
        MemoryPool::round_up(static_cast<size_t>(compact) *
                             dtype_size(half_dtype(precision.precision))) +
        r.quant_base_bytes;
  }
  at(Category::params) += adapters;
  at(Category::grads) = adapters;
  at(Category::optimizer) =
      optimizer_state_bytes(oc, lora.param_layout(), whole_range(lora.param_layout()));
  // Over data-parallel ranks (stages 0 and 3) the adapters' gradients are the slab
  // all-reduced; stage 3 gathers the frozen base's units besides, and with the base on disk
  // reads each block's part through a landing buffer ("The frozen base on disk").
  const DType half = half_dtype(precision.precision);
  at(Category::comm) =
      dist::GradientSync::comm_bytes(lora.total(), spec.bucket_bytes, spec.world, rank) +
      (placement.params_gathered()
           ? WeightGather::comm_bytes(layout, half, placement.prefetch_depth(),
                                      placement.persist_threshold())
           : 0) +
      (placement.params_in_file()
           ? WeightGather::file_ram_bytes(layout, half, placement.prefetch_depth(),
                                          placement.persist_threshold(),
                                          placement.params_file_range())
                 .comm
           : 0);
}

// The data loaders' staging: fixed buffers, plus the shuffle's permutation, whose size is
// the training data's window count (from the shard headers). With no data to read, the plan
// counts what a run with a train and a val split allocates but the permutation.
size_t loader_staging_bytes(const RunSpec& spec, PlanReport& r) {
  io::DataLoaderOptions d;
  d.batch_size = r.B;
  d.seq_len = r.T;
  d.shuffle = spec.shuffle;
  std::error_code ec;
  const auto shards = [&](const char* split) {
    return fs::is_directory(spec.data_dir, ec) ? io::find_token_shards(spec.data_dir, split)
                                              : std::vector<fs::path>{};
  };
  const auto train_shards = shards("train");
  r.data_included = !train_shards.empty();
  size_t bytes = r.data_included ? io::DataLoader::staging_bytes(train_shards, d)
                                 : io::DataLoader::buffer_bytes(d);
  const auto val_shards = shards("val");
  if (!r.data_included || !val_shards.empty())  // val: in order, no permutation
    bytes +=
        io::DataLoader::buffer_bytes(d, !val_shards.empty() && io::have_loss_masks(val_shards));
  return bytes;
}

// What a run that saves stages on this rank (0 without --save).
size_t save_staging_bytes(const RunSpec& spec, int rank, const PlanReport& r,
                          const ParamLayout& layout, const StatePlacement& placement) {
  size_t bytes = 0;
  const PrecisionOptions& precision = spec.precision;
  // A save that streams the weights of record from the offload files: its staging.
  if (spec.saves)
    for (const int64_t n :
         {save_staging_elements(spec, r.step), save_quant_staging_elements(spec, r.step)})
      if (n > 0)
        bytes += MemoryPool::round_up(static_cast<size_t>(n) * sizeof(float));
  // A save from RAM on the rank that writes model.safetensors (one process, or rank 0 at stage
  // 0; from stage 1 on the shard files hold the weights): the writer's staging, the largest
  // transposed tensor's band (GPT-2's Conv1D weights; LLaMA none).
  // (LoRA at stage 3 saves the frozen base's shards, each rank its own, straight from RAM.)
  const bool base_shards = spec.lora.enabled() && placement.params_gathered();
  // (A split layout's save writes whole tensors from every rank, through the staging above:
  // save_staging_elements.)
  if (spec.saves && !save_streams_weights(spec) && rank == 0 && !placement.sharded_save() &&
      !base_shards && !layout_split(spec.model)) {
    const DType record = precision.precision == Precision::fp32 || precision.master_weights
                             ? DType::f32
                             : half_dtype(precision.precision);
    if (const size_t b = io::save_weights_staging_bytes(r.model, layout, record); b > 0)
      bytes += MemoryPool::round_up(b);
  }
  return bytes;
}

PlanReport plan_rank(const RunSpec& spec, int rank, const SharedPlan* shared,
                     StepPlanCache* steps);

}  // namespace

const StepPlan& StepPlanCache::plan(const ModelConfig& model, int B, int T,
                                    const ActivationOptions& options) {
  const int threads = omp_get_max_threads();
  for (const Entry& e : kept_)
    if (e.B == B && e.T == T && e.threads == threads && e.options == options && e.model == model)
      return e.step;
  if (kept_.size() == kKept) kept_.pop_front();
  ++made_;
  return kept_.emplace_back(Entry{model, B, T, threads, options, plan_step(model, B, T, options)})
      .step;
}

PlanReport plan_memory(const RunSpec& spec, int rank, StepPlanCache* steps) {
  return plan_rank(spec, rank, nullptr, steps);
}

void plan_every_rank(const RunSpec& spec,
                     const std::function<void(int rank, const PlanReport&)>& visit) {
  const PlanReport first = plan_memory(spec, 0);
  visit(0, first);
  if (spec.world == 1) return;
  OptimConfig oc = spec.optim;
  oc.n_head = first.model.n_head;
  const SharedPlan shared{
      StatePlacement(ParamLayout(first.model), oc, spec.state_options(), {0, spec.world}),
      first.step};
  for (int q = 1; q < spec.world; ++q) visit(q, plan_rank(spec, q, &shared, nullptr));
}

namespace {

// --offload-params nvme: the working weights' file, and the bytes it reads and writes a step
// (r.step planned already).
void add_param_file_bytes(const RunSpec& spec, const ParamLayout& layout,
                          const StatePlacement& placement, PlanReport& r) {
  const DType half = half_dtype(spec.precision.precision);
  // The update writes every block back, and without master weights reads it first; LoRA's
  // frozen base is never written (Note [LoRA], "The frozen base on disk").
  const offload::ParamUpdateIo update =
      spec.lora.enabled()                                ? offload::ParamUpdateIo::none
      : placement.master().where != Residence::none ? offload::ParamUpdateIo::write
                                                        : offload::ParamUpdateIo::read_write;
  // At stage 3 the rank's shard of the working weights alone.
  const std::optional<ElementRange> mine = placement.params_file_range();
  const offload::ParamFileLayout file =
      offload::make_param_file_layout(layout, half, spec.persist_threshold, mine);
  // --update-in-backward: each block stepped in the slot its backward read (no read by the
  // update), and with global clipping every block read by both passes.
  offload::ParamIoBytes io = offload::param_io_bytes_per_step(
      layout, half, r.step.phases, spec.micro_batch_passes(), spec.persist_threshold, update,
      mine, spec.update_in_backward);
  // --pp: a stage before the last runs each micro-batch's forward alone too (to send its
  // output), reading its blocks (and what it prefetches) once more a pass (Note [NVMe
  // offload], "Under --pp").
  if (r.model.pipelined() && !r.model.stage.has_head())
    for (int u : WeightGather::forward_gather_units(layout, r.step.phases,
                                                    placement.prefetch_depth(),
                                                    placement.persist_threshold()))
      if (file.in_file(static_cast<size_t>(u)))
        io.read += static_cast<uint64_t>(spec.micro_batch_passes()) *
                   file.request_bytes(static_cast<size_t>(u));
  r.disk_by_category[static_cast<size_t>(Category::params)] += file.file_bytes;
  r.disk_bytes += file.file_bytes;
  r.param_read_bytes = io.read;
  r.param_written_bytes = io.written;
  r.io_bytes_per_step += io.read + io.written;
  r.param_ring_bytes = WeightGather::file_ram_bytes(layout, half, placement.prefetch_depth(),
                                                    placement.persist_threshold(), mine)
                           .staging;
}

// A pipeline stage's kept inputs and transfer buffers; none in an interleaved chunk's plan.
dist::PipelineBuffers stage_pipeline_buffers(const RunSpec& spec, const ModelConfig& model,
                                             const ActivationOptions& act) {
  if (spec.interleaved()) return {};
  return dist::pipeline_buffers(
      spec.pipe_schedule, model.stage.index, model.stage.stages, spec.grad_accum,
      dist::pipeline_boundary_floats(model, act, spec.batch, spec.T) * int64_t{sizeof(float)});
}

PlanReport plan_rank(const RunSpec& spec, int rank, const SharedPlan* shared,
                     StepPlanCache* steps) {
  spec.check();
  // Workspace sizes depend on the thread count (the kernels size per-thread scratch by
  // omp_get_max_threads()), so plan with the run's, as train() sets it.
  const ScopedThreads threads(spec.threads);
  PlanReport r;
  r.model = spec.model;
  r.model.finalize();
  MEMFIT_CHECK(spec.pp() == 1 || r.model.pipelined(), "plan",
               "a run of --pp {} is planned stage by stage (RunSpec::stage)", spec.pp());
  r.T = spec.T;
  r.B = spec.batch;
  const PrecisionOptions precision = spec.precision;
  const ActivationOptions act = spec.activation_options();

  const ParamLayout layout(r.model);
  auto slab = [&](DType dt) {
    return MemoryPool::round_up(static_cast<size_t>(layout.total()) * dtype_size(dt));
  };
  auto at = [&](Category c) -> size_t& { return r.by_category[static_cast<size_t>(c)]; };
  OptimConfig oc = spec.optim;
  oc.n_head = r.model.n_head;
  // Stages 0-1 hold a whole gradient slab; stages 2-3 their shard's sums (Note [Sharded
  // gradients]); those, the working weights (whole below stage 3), the master weights, the
  // optimizer state and the receive buffers are the rank's own (rank_bytes).
  const StatePlacement placement =
      shared ? shared->placement.of_rank(rank)
             : StatePlacement(layout, oc, spec.state_options(), {rank, spec.world});
  at(Category::grads) = slab(DType::f32);
  if (const auto files = rank_bytes(spec, layout, oc, placement, r.by_category)) {
    r.disk_by_category = files->disk_bytes();
    r.disk_bytes = files->disk_total();
    r.io_bytes_per_step = files->io_bytes_per_step();
    r.offload_staging_bytes = files->staging_bytes();
    // --offload-grads (one process): the unit buffers, which the update's gradient ring
    // reuses, instead of the slab; the gradients' file; each micro-batch's writes and reads
    // back, and the update's reads (offload/offloaded_grads.h, the engine's computation).
    if (placement.grads_in_file()) {
      const offload::GradFileLayout g = offload::make_grad_file_layout(layout, spec.grad_accum, spec.grad_dtype);
      at(Category::grads) = g.ram_bytes();
      r.disk_by_category[static_cast<size_t>(Category::grads)] += g.file_bytes;
      r.disk_bytes += g.file_bytes;
      r.io_bytes_per_step += g.io_bytes_per_step(files->pieces);
    }
  }
  if (spec.lora.enabled()) add_lora_bytes(spec, rank, layout, oc, placement, r);
  r.step = shared  ? shared->step
           : steps ? steps->plan(r.model, r.B, r.T, act)
                   : plan_step(r.model, r.B, r.T, act);
  if (placement.params_in_file()) add_param_file_bytes(spec, layout, placement, r);
  for (Category c : {Category::activations, Category::workspace})
    at(c) = r.step.arena[static_cast<size_t>(c)];
  // A pipeline stage (Note [Pipeline parallel]): the micro-batches' inputs it keeps for their
  // backwards, and the transfer buffers (dist/pipeline_runner.h: the runner's own count). An
  // interleaved chunk's are its rank's, counted once (plan/interleaved_plan.h).
  int64_t pipe_kept = 0;
  if (r.model.pipelined()) {
    const dist::PipelineBuffers pb = stage_pipeline_buffers(spec, r.model, act);
    pipe_kept = pb.activations;
    at(Category::activations) += static_cast<size_t>(pb.activations);
    at(Category::comm) += static_cast<size_t>(pb.comm);
    // Tied embeddings: the first and last stages' receive buffer for the table's gradient
    // (dist/tied_gradient.h; the last stage's copy of the table is in its layout already).
    at(Category::comm) += static_cast<size_t>(dist::tied_gradient_buffer_bytes(
        r.model.stage.index, r.model.stage.stages, tied_gradient_floats(spec, r.model, layout)));
  }
  // The tensor group's chunk buffers (dist/communicator_tensor_group.h), held the whole run.
  at(Category::comm) += static_cast<size_t>(dist::tensor_group_buffer_bytes(
      r.model.tp, spec.sp, int64_t{r.B} * r.T * r.model.d_model));
  // The slab lies in the activations arena (Note [Gradients by lifetime]): the pool counts the
  // arena's bytes, the activations', once.
  if (r.step.options.grads_in_arena) at(Category::grads) = 0;
  const DType half = half_dtype(precision.precision);
  // Every micro-batch pass gathers its blocks (stage 3) and, per unit, reduces its gradients:
  // global clipping with --update-in-backward runs the micro-batch twice (backward_passes).
  const int passes = spec.micro_batch_passes();
  // LoRA: the adapters' gradients are what the ranks sum (the frozen base has none).
  const int64_t summed =
      spec.lora.enabled() ? LoraLayout(r.model, spec.lora).total() : layout.total();
  // --pp at stage 3: a stage before the last runs each micro-batch's forward alone too (to send
  // its output), gathering its blocks once more, in every pass (Note [Pipeline parallel],
  // "ZeRO").
  const int64_t forward_gathers =
      placement.params_gathered() && r.model.pipelined() && !r.model.stage.has_head()
          ? int64_t{passes} *
                WeightGather::forward_gather_bytes(layout, half, r.step.phases,
                                                   placement.prefetch_depth(),
                                                   placement.persist_threshold())
          : 0;
  r.comm_per_step = dist::step_comm_volume(
      summed, static_cast<int>(dtype_size(half)), spec.world, placement.sharding(),
      placement.params_gathered()
          ? WeightGather::step_gather_bytes(layout, half, r.step.phases, passes,
                                            placement.persist_threshold()) -
                // A frozen base (LoRA) is never written: its persistent units are gathered
                // once, at the set-up, not after each update.
                (spec.lora.enabled()
                     ? WeightGather::step_gather_bytes(layout, half, r.step.phases, 0,
                                                       placement.persist_threshold())
                     : 0) +
                forward_gathers
          : 0,
      placement.grads_per_unit() ? passes : 1,
      static_cast<int>(dtype_size(spec.grad_dtype)));
  // Stored FP8 weights over shards of the master weights (stages 1-2, Note [FP8], "Storage"):
  // the owners' ranges gathered as codes, one byte a linear weight (dist/zero/fp8_publish.h).
  if (placement.params_fp8() && placement.owned())
    r.comm_per_step.all_gather = fp8_publish_bytes(layout, half);

  if (spec.steps > 0) at(Category::staging) = loader_staging_bytes(spec, r);
  at(Category::staging) += r.offload_staging_bytes + r.param_ring_bytes;
  at(Category::staging) += save_staging_bytes(spec, rank, r, layout, placement);
  // bf16 gradients: the update's widening buffer (Optimizer::set_grad_widen), every rank's.
  if (spec.grad_dtype == DType::bf16)
    at(Category::staging) += MemoryPool::round_up(
        static_cast<size_t>(std::max<int64_t>(1, grad_widen_elements(oc, layout))) *
        sizeof(float));
  for (size_t b : r.by_category) r.peak_bytes += b;
  const int peak = r.step.peak_phase();
  r.peak_phase = r.step.phases[peak].name();
  r.peak_live_bytes = r.peak_bytes - at(Category::activations) - at(Category::workspace) +
                      static_cast<size_t>(pipe_kept) + r.step.live[peak].total();
  return r;
}

}  // namespace

int64_t setup_piece_elements(const StepPlan& step) {
  const auto arena = static_cast<int64_t>(step.arena[static_cast<size_t>(Category::activations)]);
  return std::max<int64_t>(
      1, std::min<int64_t>(Transformer::kDefaultPieceElements, arena / int64_t{sizeof(float)}));
}

bool save_streams_weights(const RunSpec& spec) {
  const bool master =
      spec.precision.precision != Precision::fp32 && spec.precision.master_weights;
  // A quantized base (NF4, int8) in RAM: the save streams it dequantized (Note [NF4 weights],
  // "QLoRA").
  const bool quant = spec.lora.enabled() && spec.lora.base_quant().has_value();
  // LoRA's frozen base on disk (Note [LoRA], "The frozen base on disk"): streamed from its file.
  const bool frozen_file = spec.lora.enabled() && spec.offload.params;
  // (A split layout, --tp or --pp, saves through the layout map even in one data rank: its
  // ranks write their slices of the whole tensors, streamed from the files where offloaded.)
  return spec.world == 1 && !layout_split(spec.model) &&
         (quant || frozen_file || (spec.offload.optimizer && (master || spec.offload.params)));
}

int64_t save_quant_staging_elements(const RunSpec& spec, const StepPlan& step) {
  return spec.lora.enabled() && spec.lora.base_quant() ? setup_piece_elements(step) : 0;
}

int64_t save_staging_elements(const RunSpec& spec, const StepPlan& step) {
  if (!save_streams_weights(spec) && !layout_split(spec.model)) return 0;
  ModelConfig model = spec.model;
  model.finalize();
  if (!io::has_transposed_weights(model, ParamLayout(model))) return 0;
  return setup_piece_elements(step);
}

PlanReport plan_largest_rank(const RunSpec& spec, int* rank, uint64_t* disk_bytes,
                             StepPlanCache* steps) {
  PlanReport best = plan_memory(spec, 0, steps);
  int best_rank = 0;
  uint64_t most_disk = best.disk_bytes;
  if (spec.world > 1) {
    // Only rank_bytes differ between ranks: find the largest from them (a step plan per rank
    // would cost the search W step plans a candidate), then plan that rank whole.
    const ParamLayout layout(best.model);
    OptimConfig oc = spec.optim;
    oc.n_head = best.model.n_head;
    const StatePlacement placement(layout, oc, spec.state_options(), {0, spec.world});
    size_t most = best.peak_bytes;
    for (int q = 1; q < spec.world; ++q) {
      CategoryBytes bytes = best.by_category;
      // Rank 0's offload ring out of staging, rank q's in (each rank's ring is sized by its
      // own largest piece).
      bytes[static_cast<size_t>(Category::staging)] -= best.offload_staging_bytes;
      const StatePlacement mine = placement.of_rank(q);
      if (const auto files = rank_bytes(spec, layout, oc, mine, bytes)) {
        bytes[static_cast<size_t>(Category::staging)] += files->staging_bytes();
        most_disk = std::max(
            most_disk, files->disk_total() +
                           (mine.params_in_file()
                                ? offload::make_param_file_layout(
                                      layout, half_dtype(spec.precision.precision),
                                      mine.persist_threshold(), mine.params_file_range())
                                      .file_bytes
                                : 0));
      }
      size_t peak = 0;
      for (size_t b : bytes) peak += b;
      if (peak > most) most = peak, best_rank = q;
    }
    if (best_rank != 0) best = plan_memory(spec, best_rank, steps);
  }
  if (rank) *rank = best_rank;
  if (disk_bytes) *disk_bytes = most_disk;
  return best;
}

PlanReport plan_training(const RunSpec& spec, int rank, StepPlanCache* steps) {
  PlanReport r = plan_memory(spec, rank, steps);
  const ScopedThreads threads(spec.threads);
  // The run's activation options as the step plan took them (with the LM head's chunk
  // plan_step chose, which the widened route's estimate counts).
  const ActivationOptions& act = r.step.options;
  const PrecisionOptions precision = spec.precision;
  const ParamLayout layout(r.model);

  // Each micro-batch pass's FLOPs: global clipping with --update-in-backward runs the
  // micro-batch's forward and backward twice (RunSpec::backward_passes).
  const StepFlops f = step_flops(r.model, r.B, r.T, act);
  r.flops = f.total * spec.micro_batch_passes();
  r.recompute_flops = f.recompute * spec.micro_batch_passes();
  // Seconds from this CPU's calibrated rates (measured once, then cached): Note [Step-time
  // model] in docs/notes/planner.md.
  StepTimeInputs in;
  in.model = r.model;
  in.B = r.B;
  in.T = r.T;
  in.grad_accum = spec.grad_accum;
  in.backward_passes = spec.backward_passes();
  in.update_in_backward = spec.update_in_backward;
  in.options = act;
  in.param_count = static_cast<size_t>(layout.total());
  // The state's bytes stream through the update wherever they live (RAM or the offload files).
  OptimConfig oc = spec.optim;
  oc.n_head = r.model.n_head;
  // ZeRO: from stage 1 on this rank updates its shard alone, and at stage 2 its gradient norm
  // reads only the shard whose sums it holds; the collectives' bytes are the comm term.
  const StatePlacement placement(layout, oc, spec.state_options(), {rank, spec.world});
  const std::optional<ElementRange> mine = placement.owned();
  in.optimizer_bytes = optimizer_state_bytes(oc, layout, mine);
  in.optimizer_flops = optimizer_update_flops(oc, layout, mine);
  if (mine) in.update_params = std::max<size_t>(1, static_cast<size_t>(mine->size()));
  if (mine && !placement.grads_whole()) in.norm_params = in.update_params;
  in.comm_copied_bytes = r.comm_per_step.copied_bytes(spec.world);
  in.comm_summed_bytes = r.comm_per_step.summed_bytes(spec.world);
  in.tensor_comm = tensor_comm_per_step(spec, r.step, rank);  // --tp; nothing without
  in.tp_overlap = spec.tp_overlap;
  // Each group's collectives on the link its ranks span (--link, --ranks-per-node).
  const dist::GridShape grid{spec.world, spec.pp(), spec.model.tp};
  in.data_link = spec.links.axis_link(grid, dist::Axis::data);
  in.comm_messages = ring_messages(r.comm_per_step, spec.world, spec.bucket_bytes);
  in.tensor_link = spec.links.axis_link(grid, dist::Axis::tensor);
  if (spec.offload.optimizer || spec.offload.params) {
    // Half read, half written, at the rates measured in --offload-dir (once per filesystem).
    // (LoRA's frozen base on disk: its micro-batches' reads alone, no update I/O.)
    const offload::DiskRate& disk = offload::disk_rate(spec.offload.dir);
    // --offload-grads: the backward's part (blocks written, read back under accumulation) is
    // apart, hidden behind the backward rather than the update (the update's reads of the
    // gradients are with the optimizer files').
    uint64_t backward_read = 0, backward_written = 0;
    if (spec.offload.grads) {
      const offload::GradFileLayout g = offload::make_grad_file_layout(layout, spec.grad_accum, spec.grad_dtype);
      backward_read = g.backward_read();
      backward_written = g.backward_written();
      in.offload_backward_io_seconds = disk.seconds(double(backward_read), double(backward_written));
    }
    // The optimizer files half read, half written; the working weights' reads during the
    // micro-batches apart (they overlap compute), their update-time I/O with the update's.
    const double files = double(r.io_bytes_per_step - r.param_read_bytes - r.param_written_bytes -
                                backward_read - backward_written);
    // (The update's reads of the blocks: without master weights, as many as it writes; none
    // with them, nor for LoRA's frozen base, nor when it runs in the backward, on the blocks the
    // backward read.)
    const bool update_reads = !spec.lora.enabled() && !spec.update_in_backward &&
                              (spec.precision.precision == Precision::fp32 ||
                               !spec.precision.master_weights);
    const double micro_reads =
        double(r.param_read_bytes) - (update_reads ? double(r.param_written_bytes) : 0.0);
    in.offload_io_seconds = disk.seconds(files / 2.0 + (double(r.param_read_bytes) - micro_reads),
                                         files / 2.0 + double(r.param_written_bytes));
    in.param_read_seconds = disk.seconds(micro_reads, 0);
  }
  in.master_weights = precision.master_weights;
  in.compression_bytes = compression_traffic_bytes(r.step);
  r.step_time = estimate_step_time(in, machine_calibration());
  r.est_step_seconds = r.step_time.total();
  return r;
}

}  // namespace memfit
