// memfit plan: the predicted peak memory of a training run by category, when in the step it
// happens, and the step's FLOPs and estimated time, without allocating or computing anything.
// --auto (--ckpt auto, and over several ranks --zero auto unless --zero is given), --auto-batch
// and --zero auto plan the configuration that fits --mem-limit fastest; --max-model the largest
// model of the preset's family that fits it (over several ranks, each rank's --mem-limit).
#include <algorithm>
#include <memory>
#include <optional>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "memfit/cli/options/lora_from.h"
#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/commands.h"
#include "memfit/dist/communicator.h"
#include "memfit/cli/config_file.h"
#include "memfit/cli/precision_route.h"
#include "memfit/cli/search_output.h"
#include "memfit/memory/pool.h"
#include "memfit/dist/comm_volume.h"
#include "memfit/model/param_layout.h"
#include "memfit/dist/zero/unit_grads.h"
#include "memfit/offload/offloaded_grads.h"
#include "memfit/dist/zero/weight_gather.h"
#include "memfit/plan/block_activations.h"
#include "memfit/plan/calibration.h"
#include "memfit/plan/interleaved_plan.h"
#include "memfit/plan/link_model.h"
#include "memfit/plan/pipeline_time.h"
#include "memfit/plan/tensor_comm.h"
#include "memfit/plan/fit_advice.h"
#include "memfit/plan/max_model.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/state/state_placement.h"

namespace memfit::cli {

namespace {

// Weights, master weights, gradients and optimizer state: what ZeRO shards (the paper's "model
// states").
// The gradient units a plan puts in the activations arena (Note [Gradients by lifetime]).
size_t grads_slab_bytes(const PlanReport& r) {
  return plan_bytes(r.step.buffers, Category::grads);
}

// The gradients count here wherever they live (in the activations arena too).
size_t model_state_bytes(const PlanReport& r) {
  size_t b = grads_slab_bytes(r);
  for (Category c : {Category::params, Category::master, Category::grads, Category::optimizer})
    b += r.by_category[static_cast<size_t>(c)];
  return b;
}

// A rank's offload files by category and its bytes read and written a step (what its log's
// `offload` measures).
nlohmann::json rank_offload_json(const PlanReport& p) {
  nlohmann::json disk = nlohmann::json::object();
  for (Category c : kAllCategories)
    if (p.disk_by_category[static_cast<size_t>(c)])
      disk[std::string(category_name(c))] = p.disk_by_category[static_cast<size_t>(c)];
  return {{"disk_bytes", p.disk_bytes},
          {"disk_by_category", disk},
          {"io_bytes_per_step", p.io_bytes_per_step}};
}

// Every rank's peak and model state (ZeRO shards differ by a cut granule, and the receive
// buffers by rank): what `mpirun -n N memfit train` measures on each.
nlohmann::json ranks_json(const RunSpec& run) {
  nlohmann::json a = nlohmann::json::array();
  plan_every_rank(run, [&](int q, const PlanReport& p) {
    nlohmann::json cats = nlohmann::json::object();
    for (Category c : kAllCategories)
      if (p.by_category[static_cast<size_t>(c)])
        cats[std::string(category_name(c))] = p.by_category[static_cast<size_t>(c)];
    nlohmann::json rank = {{"rank", q},
                           {"peak_bytes", p.peak_bytes},
                           {"model_state_bytes", model_state_bytes(p)},
                           {"by_category", cats}};
    // Each rank's own shard in its files (rank-<q> under --offload-dir; under --tp each
    // tensor rank's slices in tensor-<t> under that).
    if (run.offload.optimizer || run.offload.params) rank["offload"] = rank_offload_json(p);
    a.push_back(std::move(rank));
  });
  return a;
}

// The whole model's parameters (padding rows included): under --tp, model.params is one rank's
// slab (its slices and the replicated norms and biases), this the tp 1 layout's.
int64_t whole_model_params(ModelConfig model) {
  model.tp = 1;
  return model.num_params();
}

// --tp: the tensor group's collectives per step and their share of the step's estimate.
void print_plan_tensor_comm(const RunSpec& run, const PlanReport& r) {
  const TensorCommVolume t = tensor_comm_per_step(run, r.step);
  // --sp: the row-parallel sums are reduce-scatters and the column-parallel inputs all-gathers
  // (a rank's part gathered, as tensor_comm_per_step counts it), beside the loss's statistics.
  const std::string scatters =
      t.reduce_scatter_count ? fmt::format(", {} reduce-scatters of {:.1f} MiB ({:.1f} MiB in all)",
                                           t.reduce_scatter_count,
                                           t.reduce_scatter_bytes / 1048576.0 /
                                               double(t.reduce_scatter_count),
                                           t.reduce_scatter_bytes / 1048576.0)
                             : "";
  fmt::print("tensor collectives per step (--tp {}): {} all-reduces of {:.1f} MiB ({:.1f} MiB in "
             "all){}, {:.1f} MiB a rank gathered ({}the loss's statistics); about {:.2f} s on "
             "the tensor group's link ({}; a model, not a measurement)\n",
             run.model.tp, t.all_reduce_count, t.all_reduce_each() / 1048576.0,
             t.all_reduce_bytes / 1048576.0, scatters, t.gathered_bytes / 1048576.0,
             run.sp ? "the sequence's parts before the column-parallel linears, "
                                   : "",
             r.step_time.tensor_comm,
             run.tp_overlap
                 ? fmt::format("{:.2f} s more hidden behind the weight-gradient GEMMs by "
                               "--tp-overlap",
                               r.step_time.tensor_comm_hidden)
                 : std::string("nothing overlapped"));
}

// --tp: the tensor group's collectives per step (bytes and count, by kind) and their seconds;
// under --pp the stage's own (plan/tensor_comm.h), which is what its ranks log each step.
nlohmann::json tensor_comm_json(const RunSpec& run, const PlanReport& r) {
  const TensorCommVolume t = tensor_comm_per_step(run, r.step);
  nlohmann::json j = {{"all_reduce", t.all_reduce_bytes},
                      {"all_reduce_count", t.all_reduce_count},
                      {"all_reduce_each", t.all_reduce_each()},
                      {"gathered", t.gathered_bytes},
                      {"seconds", r.step_time.tensor_comm},
                      {"hidden_seconds", r.step_time.tensor_comm_hidden}};
  if (t.reduce_scatter_count > 0) {  // --sp (Note [Sequence parallel])
    j["reduce_scatter"] = t.reduce_scatter_bytes;
    j["reduce_scatter_count"] = t.reduce_scatter_count;
  }
  return j;
}

// The exit code of `memfit plan` when nothing fits --mem-limit (train's out-of-memory code).
constexpr int kDoesNotFit = 3;

// The peak a per-rank --mem-limit must hold: the run's, or over several ranks the largest
// rank's (ranks differ by their shard and receive buffer).
size_t limit_peak(const RunSpec& run, const PlanReport& r) {
  return run.world > 1 ? plan_largest_rank(run).peak_bytes : r.peak_bytes;
}

// The links the collectives and transfers were priced on (plan/link_model.h): each a model
// (intra from this host's copy rate unless given, inter an estimate unless given).
nlohmann::json links_json(const LinkModel& links) {
  const Calibration& rates = machine_calibration();
  auto one = [&](const Link& l, bool given, const char* otherwise) {
    return nlohmann::json{{"bytes_per_s", link_bytes_per_s(l, rates)},
                          {"latency_s", l.latency_s},
                          {"source", given ? "--link" : otherwise}};
  };
  return {{"intra", one(links.intra, links.intra_given, "this host's copy rate")},
          {"inter", one(links.inter, links.inter_given, "estimate")},
          {"ranks_per_node", links.ranks_per_node},
          {"note", "a model, not a measurement"}};
}

nlohmann::json plan_json(const RunSpec& run, const PlanReport& r) {
  nlohmann::json j;
  j["peak_bytes"] = r.peak_bytes;
  j["model_state_bytes"] = model_state_bytes(r);
  // Per data rank; under --tp every tensor rank of a data rank holds the same shapes, so world
  // rank q is per_rank[q / tp] (Note [Tensor parallel]).
  if (run.world > 1 || run.model.tp > 1) j["per_rank"] = ranks_json(run);
  j["by_category"] = nlohmann::json::object();
  for (Category c : kAllCategories)
    j["by_category"][std::string(category_name(c))] = r.by_category[static_cast<size_t>(c)];
  // Of params (a quantized base): "nf4_base_bytes", "int8_base_bytes".
  if (r.quant_base_bytes)
    j[fmt::format("{}_base_bytes", kernels::weight_quant_name(*run.lora.base_quant()))] =
        r.quant_base_bytes;
  j["peak_phase"] = r.peak_phase;
  j["lm_head_chunk"] = r.step.options.lm_head_chunk;  // as planned (Note [Fused LM head])
  // Rows of the head's gradient per d(head) GEMM: the chunk where the gradient is not grouped.
  j["lm_head_group"] = lm_head_grad_rows(r.step.options, int64_t{run.batch} * run.T);
  j["peak_live_bytes"] = r.peak_live_bytes;
  // The gradient slab's bytes where the activations arena holds them (0: its own slab).
  j["grads_in_arena_bytes"] = grads_slab_bytes(r);
  // The step's memory timeline: bytes of activations and workspace live in each phase, and of
  // the gradient units in the arena.
  j["timeline"] = nlohmann::json::array();
  for (size_t p = 0; p < r.step.phases.size(); ++p)
    j["timeline"].push_back({{"phase", r.step.phases[p].name()},
                             {"activations", r.step.live[p].activations},
                             {"workspace", r.step.live[p].workspace},
                             {"grads", r.step.live[p].grads}});
  // What each block keeps for its backward (Note [Activation memory]): bytes per block, and the
  // largest block's buffers by name.
  const BlockActivations blocks = block_activations(r.step, r.model.n_layer);
  j["block_activations"] = {{"per_block", blocks.per_block},
                            {"layer", blocks.layer},
                            {"buffers", blocks.buffers}};
  j["flops"] = r.flops;
  j["recompute_flops"] = r.recompute_flops;
  // Forward+backward passes a micro-batch runs (2: --update-in-backward's global clipping).
  j["backward_passes"] = run.backward_passes();
  j["est_step_seconds"] = r.est_step_seconds;
  if (run.world > 1) {
    const int64_t n = ParamLayout(r.model).total();
    const int param_bytes = static_cast<int>(dtype_size(half_dtype(run.precision.precision)));
    const dist::CommVolume& v = r.comm_per_step;
    j["comm_per_step"] = {{"all_reduce", v.all_reduce},
                          {"reduce_scatter", v.reduce_scatter},
                          {"all_gather", v.all_gather},
                          {"psi_multiple", v.psi_multiple(n, static_cast<int>(dtype_size(run.grad_dtype)), param_bytes)}};
  }
  if (run.world > 1 || run.model.tp > 1 || run.pp() > 1) j["links"] = links_json(run.links);
  j["step_time"] = {{"block_gemm", r.step_time.block_gemm},
                    {"attention", r.step_time.attention},
                    {"head_gemm", r.step_time.head_gemm},
                    {"elementwise", r.step_time.elementwise},
                    {"compression", r.step_time.compression},
                    {"optimizer", r.step_time.optimizer},
                    {"offload_io", r.step_time.offload_io},
                    {"comm", r.step_time.comm},
                    {"tensor_comm", r.step_time.tensor_comm}};
  j["model"] = {{"family", family_name(r.model.family)}, {"n_layer", r.model.n_layer},
                {"n_head", r.model.n_head},       {"n_kv_head", r.model.n_kv_head},
                {"d_model", r.model.d_model},     {"ffn_dim", r.model.ffn_dim},
                {"vocab_size", r.model.vocab_size}, {"params", r.model.num_params()},
                {"whole_params", whole_model_params(r.model)}};
  j["batch"] = r.B;
  j["ranks"] = run.world;
  j["zero"] = run.zero;
  j["tp"] = run.model.tp;  // tensor-parallel ranks: every figure above is one rank's
  j["sp"] = run.sp;        // --sp: the sequence split over them too (Note [Sequence parallel])
  if (run.model.tp > 1) j["tensor_comm_per_step"] = tensor_comm_json(run, r);
  j["seq_len"] = r.T;
  j["precision"] = precision_name(run.precision.precision);
  j["ckpt"] = run.ckpt.name();
  j["act_compress"] = act_compress_name(run.act_compress);
  j["attention"] = attention_kind_name(run.attention);
  j["optim"] = run.optim.name;
  j["optim_state_dtype"] = std::string(optim_state_dtype_name(run.optim.state_dtype));
  j["grad_dtype"] = run.grad_dtype == DType::bf16 ? "bf16" : "fp32";
  j["master_weights"] = run.precision.master_weights ? "fp32" : "none";
  j["data_included"] = r.data_included;
  if (run.offload.optimizer || run.offload.params) {
    // NVMe offload: what lives on disk instead, and what one step moves (LoRA: the frozen
    // base's file alone).
    nlohmann::json disk = nlohmann::json::object();
    for (Category c : kAllCategories)
      if (r.disk_by_category[static_cast<size_t>(c)])
        disk[std::string(category_name(c))] = r.disk_by_category[static_cast<size_t>(c)];
    j["offload"] = {{"dir", run.offload.dir},
                    {"disk_bytes", r.disk_bytes},
                    {"disk_by_category", disk},
                    {"io_bytes_per_step", r.io_bytes_per_step},
                    {"staging_ring_bytes", r.offload_staging_bytes},
                    {"grads", run.offload.grads}};
    if (run.offload.params)
      j["offload"]["params"] = {
          {"file_bytes", r.disk_by_category[static_cast<size_t>(Category::params)]},
          {"read_bytes_per_step", r.param_read_bytes},
          {"written_bytes_per_step", r.param_written_bytes},
          {"ring_bytes", r.param_ring_bytes},
          {"prefetch_depth", run.prefetch_depth}};
  }
  if (run.mem_limit) {
    j["mem_limit_bytes"] = run.mem_limit;
    j["fits"] = limit_peak(run, r) <= run.mem_limit;
  }
  return j;
}

// Over several ranks: the collectives per step, where stage 3's gathers and per-unit gradients
// live, and the extremes of the ranks' peaks.
void print_plan_ranks(const RunSpec& run, const PlanReport& r) {
  const int64_t n = ParamLayout(r.model).total();
  const int param_bytes = static_cast<int>(dtype_size(half_dtype(run.precision.precision)));
  const dist::CommVolume& v = r.comm_per_step;
  fmt::print("collectives per step: all-reduce {:.1f} MiB, reduce-scatter {:.1f} MiB, "
             "all-gather {:.1f} MiB ({:.3g} x the parameters sent per rank, as a ring)\n",
             v.all_reduce / 1048576.0, v.reduce_scatter / 1048576.0, v.all_gather / 1048576.0,
             v.psi_multiple(n, static_cast<int>(dtype_size(run.grad_dtype)), param_bytes));
  OptimConfig oc = run.optim;
  oc.n_head = r.model.n_head;
  const StatePlacement placement(ParamLayout(r.model), oc, run.state_options(), {0, run.world});
  if (placement.params_gathered()) {
    // Where stage 3's gathered weights live (Note [ZeRO stage 3]).
    const GatherUnits g = gather_units(ParamLayout(r.model), placement.persist_threshold());
    fmt::print("stage 3 gathers into comm: {:.1f} MiB kept whole (the embeddings and the tail{}) "
               "and a ring of {} x {:.1f} MiB block slots (--prefetch-depth {})\n",
               g.persistent_elements * param_bytes / 1048576.0,
               g.persistent_elements > g.units.front().size() + g.units.back().size()
                   ? ", and every block under --persist-threshold"
                   : "",
               g.slot_elements > 0 ? run.prefetch_depth + 1 : 0,
               g.slot_elements * param_bytes / 1048576.0, run.prefetch_depth);
  }
  if (placement.grads_per_unit()) {
    // Where the per-unit gradients live (Note [Sharded gradients]).
    const ParamLayout layout(r.model);
    fmt::print("gradients reduced per unit{}{}: {:.1f} MiB in comm (the embeddings and the "
               "tail, and {} x {:.1f} MiB block slots, f32)\n",
               run.grad_accum > 1 ? fmt::format(", every micro-batch ({})", run.grad_accum)
                                  : std::string(),
               run.grad_dtype == DType::bf16 ? " in bf16" : "",
               (UnitGrads::edge_floats(layout) + UnitGrads::kSlots * UnitGrads::slot_floats(layout)) *
                   4 / 1048576.0,
               UnitGrads::kSlots, UnitGrads::slot_floats(layout) * 4 / 1048576.0);
  }
  // Shards differ by a cut granule and receive buffers by rank: the extremes over ranks.
  size_t lo = r.peak_bytes, hi = r.peak_bytes;
  int lo_rank = 0, hi_rank = 0;
  plan_every_rank(run, [&](int q, const PlanReport& p) {
    if (p.peak_bytes < lo) lo = p.peak_bytes, lo_rank = q;
    if (p.peak_bytes > hi) hi = p.peak_bytes, hi_rank = q;
  });
  if (lo != hi)
    fmt::print("ranks' peaks: from {} bytes (rank {}) to {} bytes (rank {}); --json lists "
               "each\n",
               lo, lo_rank, hi, hi_rank);
}

// --offload-optimizer nvme (and --offload-params, --offload-grads): what is on disk, what moves a
// step, and the rings in RAM.
void print_plan_offload(const RunSpec& run, const PlanReport& r) {
  if (!run.offload.optimizer) {
    // LoRA's frozen base on disk (Note [LoRA], "The frozen base on disk"): read only.
    fmt::print("offload: the frozen base's blocks on disk in {} ({:.1f} MiB; params above is "
               "the embeddings, the tail and the adapters), {:.1f} MiB read per step before "
               "each block's phases and nothing written (LoRA's base is read only; the "
               "adapters and their optimizer stay in RAM), through a ring of {} block slots "
               "({:.1f} MiB, in staging above); the disk adds about {:.2f} s a step beyond the "
               "compute\n",
               run.offload.dir, r.disk_bytes / 1048576.0, r.param_read_bytes / 1048576.0,
               run.prefetch_depth + 1, r.param_ring_bytes / 1048576.0, r.step_time.offload_io);
    return;
  }
  std::string disk;
  for (Category c : kAllCategories)
    if (const size_t b = r.disk_by_category[static_cast<size_t>(c)])
      disk += fmt::format("{}{} {:.1f} MiB", disk.empty() ? "" : ", ", category_name(c),
                          b / 1048576.0);
  fmt::print("offload: {} on disk in {} ({:.1f} MiB: {}); {:.1f} MiB read and written per "
             "step through a staging ring of {:.1f} MiB (in staging above); the disk adds "
             "about {:.2f} s a step beyond the update's compute\n",
             std::string(run.offload.params ? "working weights, " : "") +
                 (r.disk_by_category[static_cast<size_t>(Category::master)]
                      ? "master weights and optimizer state"
                      : "optimizer state") +
                 (run.offload.grads ? " and gradients" : ""),
             run.world > 1 || run.model.tp > 1 || run.model.pipelined()
                 ? fmt::format("{}{}{}{} ({}; each rank its own)", run.offload.dir,
                               run.world > 1 ? "/rank-0" : "",
                               run.model.pipelined()
                                   ? fmt::format("/stage-{}", run.model.stage.index)
                                   : "",
                               run.model.tp > 1 ? "/tensor-0" : "",
                               run.world > 1      ? "rank 0's shard"
                               : run.model.tp > 1 ? "rank 0's slices"
                                                  : "this stage's")
                 : run.offload.dir, r.disk_bytes / 1048576.0, disk, r.io_bytes_per_step / 1048576.0,
             r.offload_staging_bytes / 1048576.0, r.step_time.offload_io);
  if (run.offload.params)
    fmt::print("offload: the blocks' working weights on disk too ({:.1f} MiB; params above "
               "is the embeddings and the tail), {:.1f} MiB read per step before each "
               "block's phases and {:.1f} MiB written back by the update, through a ring of "
               "{} block slots ({:.1f} MiB, in staging above)\n",
               r.disk_by_category[static_cast<size_t>(Category::params)] / 1048576.0,
               r.param_read_bytes / 1048576.0, r.param_written_bytes / 1048576.0,
               run.prefetch_depth + 1, r.param_ring_bytes / 1048576.0);
  if (run.offload.grads) {
    // The gradients' RAM (grads above): one unit's buffers, not the slab.
    const offload::GradFileLayout g =
        offload::make_grad_file_layout(ParamLayout(r.model), run.grad_accum, run.grad_dtype);
    const bool bf16 = run.grad_dtype == DType::bf16;
    fmt::print("offload-grads: no gradient slab ({:.1f} MiB in RAM otherwise); grads holds "
               "the embeddings' and the tail's buffers and {} block slots of {:.1f} MiB{}, "
               "which the update's gradient ring reuses; each block written per micro-batch"
               "{}{}\n",
               ParamLayout(r.model).total() * double(dtype_size(run.grad_dtype)) / 1048576.0,
               g.block_slots, g.slot_bytes / 1048576.0,
               bf16 && run.grad_accum > 1
                   ? fmt::format(" (f32), the edges' bf16 sums ({:.1f} MiB) and one block's "
                                 "read back ({:.1f} MiB)",
                                 (g.edge_sums_bytes + g.tail_sums_bytes) / 1048576.0,
                                 g.read_bytes / 1048576.0)
                   : std::string(bf16 ? " (f32)" : ""),
               run.grad_accum > 1 ? " and read back before the next one's backward" : "",
               bf16 ? "; the file holds bf16 sums" : "");
  }
}

void print_plan(const RunSpec& run, const PlanReport& r) {
  fmt::print("memfit plan: {} layers x {} wide ({:.1f}M parameters{}), {} x {} tokens, {}, "
             "--ckpt {}{}, --attention {}, --optim {}{}\n\n",
             r.model.n_layer, r.model.d_model, r.model.num_params() / 1e6,
             r.model.tp > 1 ? fmt::format(" a rank, {:.1f}M in the whole model",
                                          whole_model_params(r.model) / 1e6)
                            : std::string(),
             r.B, r.T,
             precision_name(run.precision.precision), run.ckpt.name(),
             run.act_compress == ActCompress::none
                 ? std::string()
                 : fmt::format(", --act-compress {}", act_compress_name(run.act_compress)),
             attention_kind_name(run.attention),
             run.optim.state_dtype == DType::f32
                 ? run.optim.name
                 : fmt::format("{} --optim-state-dtype {}", run.optim.name,
                               optim_state_dtype_name(run.optim.state_dtype)),
             (run.world > 1 ? fmt::format("; rank 0 of {} data-parallel ranks at ZeRO stage {} "
                                          "holds",
                                          run.world, run.zero)
                            : std::string()) +
                 (run.model.tp > 1
                      ? fmt::format("; each of --tp {} tensor ranks holds its slice of every "
                                    "layer{} (Note [Tensor parallel])",
                                    run.model.tp,
                                    run.sp ? " and 1/tp of the sequence between them (--sp)"
                                           : "")
                      : std::string()) +
                 (r.model.pipelined()
                      ? fmt::format("; pipeline stage {} of {} (blocks {}-{}{}{}) holds its own "
                                    "parameters alone (Note [Pipeline parallel])",
                                    r.model.stage.index, r.model.stage.stages,
                                    r.model.stage.first, r.model.stage.last - 1,
                                    r.model.stage.has_embeddings() ? ", the embeddings" : "",
                                    r.model.stage.has_head() ? ", the final norm and LM head"
                                                             : "")
                      : std::string()));
  fmt::print("{:<12} {:>12}\n", "category", "MiB");
  for (Category c : kAllCategories) {
    const size_t b = r.by_category[static_cast<size_t>(c)];
    if (b) fmt::print("{:<12} {:>12.1f}\n", category_name(c), b / 1048576.0);
  }
  fmt::print("{:<12} {:>12.1f}  ({} bytes)\n", "total", r.peak_bytes / 1048576.0,
             r.peak_bytes);
  fmt::print("model state (params, master, grads, optimizer): {:.1f} MiB ({:.3g} GB)\n",
             model_state_bytes(r) / 1048576.0, model_state_bytes(r) / 1e9);
  if (r.quant_base_bytes) {  // NF4 or int8 (Note [NF4 weights], "QLoRA"): what params holds
    const size_t adapters = r.by_category[static_cast<size_t>(Category::grads)];
    const size_t params = r.by_category[static_cast<size_t>(Category::params)];
    const bool nf4 = run.lora.base_quant() == kernels::WeightQuant::nf4;
    fmt::print("params: the {} base's block linears {:.1f} MiB, the rest of the base "
               "(embeddings, norms, head) in {} {:.1f} MiB, the adapters (f32) {:.1f} MiB\n",
               nf4 ? "NF4" : "int8", r.quant_base_bytes / 1048576.0,
               precision_name(run.precision.precision),
               (params - r.quant_base_bytes - adapters) / 1048576.0, adapters / 1048576.0);
  }
  if (r.step.options.grads_in_arena)
    fmt::print("gradients: the f32 slab ({:.1f} MiB) lies in the activations arena, each unit "
               "in bytes whose activations died before its backward (one micro-batch a step, "
               "a whole slab: docs/notes/planner.md, Note [Gradients by lifetime])\n",
               grads_slab_bytes(r) / 1048576.0);
  if (run.update_in_backward)
    fmt::print("gradients: no slab (--update-in-backward): one f32 slot each unit takes in turn"
               "{} ({:.1f} MiB), each unit stepped by the optimizer as its backward ends "
               "(docs/notes/update-in-backward.md, Note [Update in backward])\n",
               run.model.tie_embeddings ? ", and the tied embedding table's buffer" : "",
               r.by_category[static_cast<size_t>(Category::grads)] / 1048576.0);
  if (run.backward_passes() == 2)
    fmt::print("clipping: global clipping (--clip-mode global) with --update-in-backward runs "
               "the backward twice: a first forward and backward measures the global norm, a "
               "second steps every unit; the step's time and FLOPs{} count both passes "
               "(--clip-mode unit or --clip 0 takes one)\n",
               run.world > 1 ? " and its collectives" : "");
  if (run.world > 1) print_plan_ranks(run, r);
  if (run.model.tp > 1) print_plan_tensor_comm(run, r);
  fmt::print("\n");
  const PhaseBytes& live = r.step.live[r.step.peak_phase()];
  auto mib = [](size_t b) { return b / 1048576.0; };
  fmt::print("peak: {} ({:.1f} MiB of activations{} and {:.1f} MiB of workspace live then, in "
             "arenas of {:.1f} and {:.1f} MiB)\n",
             r.peak_phase, mib(live.activations),
             r.step.options.grads_in_arena ? fmt::format(", {:.1f} of gradients", mib(live.grads))
                                           : std::string(),
             mib(live.workspace),
             mib(r.by_category[static_cast<size_t>(Category::activations)]),
             mib(r.by_category[static_cast<size_t>(Category::workspace)]));
  fmt::print("step: {:.3g} TFLOP ({:.3g} of them recomputation), about {:.2f} s on this "
             "machine (GEMMs {:.2f} s, attention {:.2f} s, element-wise {:.2f} s, {}optimizer "
             "{:.2f} s{}; from the calibration of this CPU, see `memfit calibrate`)\n",
             r.flops / 1e12, r.recompute_flops / 1e12, r.est_step_seconds,
             r.step_time.block_gemm + r.step_time.head_gemm, r.step_time.attention,
             r.step_time.elementwise,
             r.step_time.compression > 0
                 ? fmt::format("compression {:.2f} s, ", r.step_time.compression)
                 : std::string(),
             r.step_time.optimizer,
             (run.world > 1 ? fmt::format(", collectives {:.2f} s on the data group's link",
                                          r.step_time.comm)
                            : std::string()) +
                 (run.model.tp > 1 ? fmt::format(", tensor collectives {:.2f} s",
                                                 r.step_time.tensor_comm)
                                   : std::string()));
  if (run.world > 1 || run.model.tp > 1)
    fmt::print("links: {}; the collectives' seconds are a model on these links, not a "
               "measurement\n",
               describe_links(run.links, machine_calibration()));
  if (run.offload.optimizer || run.offload.params) print_plan_offload(run, r);
  if (!r.data_included)
    fmt::print("(no training data found in {}: staging counts the train and val loaders' "
               "buffers, not the permutation a shuffled run adds, 4 bytes per {}-token window "
               "of the training data)\n",
               run.data_dir, r.T);
  if (run.mem_limit) {
    const size_t limit = run.mem_limit, peak = limit_peak(run, r);
    fmt::print("--mem-limit {}{}: {}\n", format_mib(limit),
               run.world > 1 ? " (each rank's; the largest rank's peak)" : "",
               peak <= limit ? fmt::format("fits, {} to spare", format_mib(limit - peak))
                             : fmt::format("does NOT fit, {} short", format_mib(peak - limit)));
  }
}

bool plan_pipeline(const RunSpec& asked, bool json, const nlohmann::json& extra);

// --auto and --auto-batch: the search's choice and runner-ups, then the plan of the choice (of
// the smallest footprint when nothing fits, with the advice on other options).
// Returns whether the search found a run that fits.
bool plan_with_search(const TrainConfig& cfg, const RunSpec& spec, bool json,
                      StartingCheckpoint& start) {
  std::string note;
  const SearchResult s = plan_auto(cfg, spec, &note, start);
  const RunSpec run = apply_candidate(spec, s.choice);
  if (run.pp() > 1) {
    // A pipelined layout (the layout search's): its stages' plans as `plan --pp` prints them.
    nlohmann::json extra;
    if (json) {
      extra["search"] = search_json(s);
      if (!note.empty()) extra["search"]["note"] = note;
    } else {
      print_search(s, note);
      if (!s.fits) fmt::print("{}\n\n", advise_fit(spec, s.limit).text());
      fmt::print("{}", s.fits ? "the chosen run:\n" : "the smallest footprint:\n");
    }
    plan_pipeline(run, json, extra);
    return s.fits;
  }
  const PlanReport r = plan_training(run);
  if (json) {
    nlohmann::json j = plan_json(run, r);
    j["search"] = search_json(s);
    if (!note.empty()) j["search"]["note"] = note;
    fmt::print("{}\n", j.dump(2));
    return s.fits;
  }
  print_search(s, note);
  if (!s.fits) fmt::print("{}\n\n", advise_fit(spec, s.limit).text());
  fmt::print("{}", s.fits ? "the chosen run:\n" : "the smallest footprint:\n");
  print_plan(run, r);
  return s.fits;
}

// Returns whether some member fits. `policy`: every member's (--ckpt given), else each one's
// fastest that fits.
bool plan_max_model(const RunSpec& spec, bool json,
                    const std::optional<CheckpointPolicy>& policy) {
  const MaxModelResult r = find_max_model(spec, spec.mem_limit, policy);
  if (json)
    fmt::print("{}\n", nlohmann::json({{"max_model", max_model_json(r)}}).dump(2));
  else
    print_max_model(r);
  return r.found;
}

nlohmann::json pipeline_time_json(const PipelineTime& t) {
  return {{"step_seconds", t.step},
          {"slot_seconds", t.slot},
          {"slowest_stage", t.slowest},
          {"slots", t.slots()},
          {"bubble_seconds", t.bubble()},
          {"bubble_share", t.bubble_share()},
          {"bubble_fraction", t.bubble_fraction()},  // (p - 1)/m
          {"once_seconds", t.once_most},
          {"p2p_bytes", t.p2p_bytes},  // one transfer, each way, per micro-batch and cut
          {"p2p_bytes_per_step", 2 * t.p2p_bytes * t.micro_batches},  // per cut
          {"cut_inter", t.cut_inter},
          {"note", "a model, not a measurement"}};
}

// --pp: the step as the schedule runs it, the bubble and the transfers, and the links priced.
void print_pipeline_time(const RunSpec& spec, const PipelineTime& t) {
  const size_t s = static_cast<size_t>(t.slowest);
  const int V = t.virtual_stages;
  const std::string mv = V > 1 ? fmt::format("{} x {}", t.micro_batches, V)
                               : fmt::format("{}", t.micro_batches);
  fmt::print("\nstep: about {:.3g} s (a model, not a measurement): {} + {} - 1 = {} slots of "
             "{:.3g} s, stage {}'s {}micro-batch ({:.3g} s of compute, {:.3g} s of receives: its "
             "sends overlap its compute), then {:.3g} s once a step (the update{})\n",
             t.step, mv, t.stages, t.slots(), t.slot, t.slowest, V > 1 ? "chunk's " : "",
             t.compute[s] / V, t.p2p[s] / V, t.once_most,
             spec.world > 1 ? ", the data group's collectives" : "");
  fmt::print("bubble: {:.3g} s, {:.1f}% of the step: the fill and the drain, {} = "
             "{}/{} = {:.3g} of the ideal {} slots ({}--pp-schedule {})\n",
             t.bubble(), 100 * t.bubble_share(), V > 1 ? "(p - 1)/(v m)" : "(p - 1)/m",
             t.stages - 1, mv,
             t.bubble_fraction(), mv, V > 1 ? "" : "gpipe and 1f1b alike; ",
             pipe_schedule_label(spec));
  int crossing = 0;
  for (bool b : t.cut_inter) crossing += b;
  fmt::print("point to point: {:.2f} MiB a micro-batch each way across each cut, a rank's (B x T "
             "x d_model f32; under --tp each tensor rank's copy, with --sp its rows), {:.1f} MiB "
             "a step a cut; {} of {} cuts across nodes\n",
             t.p2p_bytes / 1048576.0, 2.0 * t.p2p_bytes * t.micro_batches / 1048576.0, crossing,
             t.cut_inter.size());
  fmt::print("links: {}\n", describe_links(spec.links, machine_calibration()));
}

// One rank of a pipeline (--pp): its stage, its data rank, its tensor rank and its plan.
struct StageRankPlan {
  int rank = 0, stage = 0, data = 0, tensor = 0;
  PlanReport plan;
};

nlohmann::json categories_json(const CategoryBytes& bytes) {
  nlohmann::json cats = nlohmann::json::object();
  for (Category c : kAllCategories)
    if (bytes[static_cast<size_t>(c)])
      cats[std::string(category_name(c))] = bytes[static_cast<size_t>(c)];
  return cats;
}

// A stage's blocks as the plan prints them: "4-7", or an interleaved rank's chunks "0-1+4-5".
std::string stage_blocks(const RunSpec& spec, int s) {
  std::string text;
  for (int c = 0; c < spec.pipe_virtual; ++c) {
    const PipelineStage& st = spec.pipeline[static_cast<size_t>(c * spec.pp() + s)];
    text += fmt::format("{}{}-{}", c ? "+" : "", st.first, st.last - 1);
  }
  return text;
}

// --pp (Note [Pipeline parallel]): every stage's plan, each stage's model holding its own
// parameters (RunSpec::stage), and every world rank's (data x pipeline x tensor: world rank
// q = (data * pp + stage) * tp + tensor; the tensor ranks of a stage hold the same shapes) with
// its shard and receive buffers; the JSON's top level is the largest stage's plan, with
// "stages" and "per_rank" (one per world rank) beside it, and `extra`'s keys (the search's,
// for a layout `plan --auto` chose). Returns whether every rank fits --mem-limit.
bool plan_pipeline(const RunSpec& asked, bool json, const nlohmann::json& extra) {
  RunSpec spec = asked;
  std::string split_note;  // --pp-layers auto: how the cut was chosen
  if (spec.pp_layers_auto) {
    const StageSplit split = balance_stages(spec);
    spec.pipeline = split.stages;
    spec.check();
    split_note = split.why;
  }
  const int P = spec.pp(), TP = spec.model.tp;
  std::vector<PlanReport> stages;
  std::vector<StageRankPlan> ranks;
  int largest = 0;
  for (int s = 0; s < P; ++s) {
    const RunSpec run = spec.stage(s);
    if (spec.interleaved()) {  // the rank's chunks together (plan/interleaved_plan.h)
      stages.push_back(plan_interleaved_rank(spec, s, 0, true));
      for (int d = 0; d < spec.world; ++d) {
        const PlanReport r = plan_interleaved_rank(spec, s, d, false);
        for (int t = 0; t < TP; ++t) ranks.push_back({(d * P + s) * TP + t, s, d, t, r});
      }
    } else {
      stages.push_back(plan_training(run));
      plan_every_rank(run, [&](int d, const PlanReport& r) {
        for (int t = 0; t < TP; ++t) ranks.push_back({(d * P + s) * TP + t, s, d, t, r});
      });
    }
    if (stages.back().peak_bytes > stages[static_cast<size_t>(largest)].peak_bytes) largest = s;
  }
  std::sort(ranks.begin(), ranks.end(),
            [](const StageRankPlan& a, const StageRankPlan& b) { return a.rank < b.rank; });
  size_t most = 0;
  for (const StageRankPlan& q : ranks) most = std::max(most, q.plan.peak_bytes);
  const bool fits = !spec.mem_limit || most <= spec.mem_limit;
  const RunSpec top = spec.stage(largest);
  const PlanReport& r = stages[static_cast<size_t>(largest)];
  ModelConfig whole = spec.model;
  whole.finalize();
  whole.tp = 1;  // under --tp the model's, not one tensor rank's
  const int64_t whole_params = ParamLayout(whole).total();
  const PipelineTime time =
      plan_pipeline_time(spec, stages, machine_calibration(), spec.pipe_virtual);
  if (json) {
    nlohmann::json j = plan_json(top, r);
    // The run's step: the pipeline's (the largest stage's own is under stages).
    j["est_step_seconds"] = time.step;
    j["pipeline_time"] = pipeline_time_json(time);
    if (!split_note.empty()) j["pp_layers_note"] = split_note;
    j["pp"] = P;
    j["pp_schedule"] = spec.interleaved() ? "interleaved"
                                          : std::string(pipe_schedule_name(spec.pipe_schedule));
    j["pp_virtual"] = spec.pipe_virtual;
    j["pp_layers"] = describe_stages(spec.pipeline);
    j["largest_stage"] = largest;
    j["whole_model_params"] = whole_params;
    j["stages"] = nlohmann::json::array();
    for (int s = 0; s < P; ++s) {
      const PlanReport& p = stages[static_cast<size_t>(s)];
      const PipelineStage& st = spec.pipeline[static_cast<size_t>(s)];
      j["stages"].push_back({{"stage", s},
                             {"blocks", stage_blocks(spec, s)},
                             {"embeddings", st.has_embeddings()},
                             {"head", spec.interleaved() ? s + 1 == P : st.has_head()},
                             {"params", spec.interleaved() ? interleaved_rank_params(spec, s)
                                                           : p.model.num_params()},
                             {"peak_bytes", p.peak_bytes},
                             {"model_state_bytes", model_state_bytes(p)},
                             {"by_category", categories_json(p.by_category)},
                             {"flops", p.flops},
                             {"est_step_seconds", p.est_step_seconds},
                             {"micro_batch_seconds", time.compute[static_cast<size_t>(s)]},
                             {"p2p_seconds", time.p2p[static_cast<size_t>(s)]},
                             {"once_seconds", time.once[static_cast<size_t>(s)]},
                             {"stage_step_seconds", time.stage_step(s)}});
      if (TP > 1) j["stages"].back()["tensor_comm_per_step"] = tensor_comm_json(spec.stage(s), p);
      if (spec.world > 1)  // the data group's collectives of this stage's ranks
        j["stages"].back()["comm_per_step"] = {{"all_reduce", p.comm_per_step.all_reduce},
                                               {"reduce_scatter", p.comm_per_step.reduce_scatter},
                                               {"all_gather", p.comm_per_step.all_gather}};
    }
    j["per_rank"] = nlohmann::json::array();
    for (const StageRankPlan& q : ranks)
      j["per_rank"].push_back({{"rank", q.rank},
                               {"stage", q.stage},
                               {"data_rank", q.data},
                               {"tensor_rank", q.tensor},
                               {"peak_bytes", q.plan.peak_bytes},
                               {"model_state_bytes", model_state_bytes(q.plan)},
                               {"by_category", categories_json(q.plan.by_category)}});
    // --offload-optimizer (Note [NVMe offload], "Under --pp"): each rank's files, in
    // stage-<s>/ under its data rank's directory.
    if (spec.offload.optimizer || spec.offload.params)
      for (size_t q = 0; q < ranks.size(); ++q)
        j["per_rank"][q]["offload"] = rank_offload_json(ranks[q].plan);
    if (spec.mem_limit) j["fits"] = fits;
    for (const auto& [key, value] : extra.items()) j[key] = value;
    fmt::print("{}\n", j.dump(2));
    return fits;
  }
  fmt::print("memfit plan: --pp {} stages (blocks {}), --pp-schedule {}, {} micro-batches a "
             "step (--grad-accum); each stage's ranks hold its parameters, gradients and "
             "optimizer state alone ({:.1f}M of the model's {:.1f}M parameters on the largest "
             "stage)\n\n",
             P, describe_stages(spec.pipeline), pipe_schedule_label(spec),
             spec.grad_accum,
             (spec.interleaved() ? interleaved_rank_params(spec, largest) : r.model.num_params()) /
                 1e6,
             whole_params / 1e6);
  if (!split_note.empty()) fmt::print("{}\n\n", split_note);
  fmt::print("{:<6} {:>7}", "stage", "blocks");
  for (Category c : kAllCategories) fmt::print(" {:>11}", category_name(c));
  fmt::print(" {:>11} {:>11} {:>11} {:>11}\n", "total MiB", "state MiB", "ms/micro", "p2p ms");
  for (int s = 0; s < P; ++s) {
    const PlanReport& p = stages[static_cast<size_t>(s)];
    fmt::print("{:<6} {:>7}", s, stage_blocks(spec, s));
    for (Category c : kAllCategories)
      fmt::print(" {:>11.2f}", p.by_category[static_cast<size_t>(c)] / 1048576.0);
    fmt::print(" {:>11.2f} {:>11.2f} {:>11.3g} {:>11.3g}\n", p.peak_bytes / 1048576.0,
               model_state_bytes(p) / 1048576.0, time.compute[static_cast<size_t>(s)] * 1e3,
               time.p2p[static_cast<size_t>(s)] * 1e3);
  }
  fmt::print("(activations include the inputs a stage keeps for its backwards, comm its transfer "
             "buffers; ms/micro is a micro-batch's compute on the stage, its forward again "
             "before the backward on all but the last, p2p ms the transfers it waits for: its "
             "receives)\n");
  print_pipeline_time(spec, time);
  fmt::print("\nthe largest stage, {} (its step line is the stage's own work, without the "
             "pipeline's bubble and transfers: the step above has them{}):\n",
             largest,
             spec.interleaved() ? "; interleaved: its first chunk's model and step, the "
                                  "rank's bytes by category in the table above"
                                : "");
  print_plan(top, r);
  if (spec.mem_limit)
    fmt::print("--mem-limit {} (each rank's): {}\n", format_mib(spec.mem_limit),
               fits ? fmt::format("every rank fits, the largest peak {}", format_mib(most))
                    : fmt::format("does NOT fit, the largest rank {} short",
                                  format_mib(most - spec.mem_limit)));
  return fits;
}

// Plans a run as given, nothing searched; returns whether it fits --mem-limit (true without).
bool plan_fixed(const RunSpec& spec, bool json) {
  if (spec.pp() > 1) return plan_pipeline(spec, json, {});
  const PlanReport r = plan_training(spec);
  if (json)
    fmt::print("{}\n", plan_json(spec, r).dump(2));
  else
    print_plan(spec, r);
  return !spec.mem_limit || limit_peak(spec, r) <= spec.mem_limit;
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plan", "Predict a training run's peak memory by category and its step time, without "
              "running it (takes the options of train)");
  auto cfg = std::make_shared<TrainConfig>();
  auto config_file = std::make_shared<std::string>();
  auto json = std::make_shared<bool>(false);
  auto auto_ckpt = std::make_shared<bool>(false);
  auto max_model = std::make_shared<bool>(false);
  add_train_options(cmd, *cfg, *config_file);
  cmd->add_flag("--json", *json, "Print one JSON object");
  cmd->add_option("--world-size,--ranks", cfg->ranks,
                  "Plan for this many ranks (mpirun -n): data x pipeline (--pp) x tensor (--tp) "
                  "ranks, the bytes of each (default: --tp x --pp, one data rank)");
  cmd->add_flag("--auto", *auto_ckpt,
                "Choose the fastest checkpoint policy that fits --mem-limit (as --ckpt auto) "
                "and, over several ranks, the ZeRO stage (as --zero auto) unless --zero is "
                "given, and the layout tp x pp x dp of --world-size unless --tp or --pp is "
                "(tensor groups up to --ranks-per-node, else 8; the global batch kept; the "
                "times a model, not a measurement); in bf16, where nothing fits, also "
                "--grad-dtype bf16 and then --master-weights none unless either is given");
  cmd->add_flag("--max-model", *max_model,
                "The largest model of the preset's family (layers x width) that trains under "
                "--mem-limit, each with its fastest policy, or with --ckpt's where given (in "
                "bf16, the levers of --auto too)");
  cmd->callback([cmd, cfg, config_file, json, auto_ckpt, max_model] {
    if (!config_file->empty()) apply_toml_config(*cmd, *config_file);
    // `memfit plan --tp 2 --pp 2` plans the 4 ranks that layout needs, not one it cannot split.
    if (cmd->get_option("--world-size")->count() == 0 && cfg->ranks == 1)
      cfg->ranks = std::max(1, cfg->tp) * std::max(1, cfg->pp);
    if (*auto_ckpt) {
      if (cmd->get_option("--ckpt")->count() > 0 && cfg->ckpt != "auto")
        MEMFIT_THROW(ConfigError, "config",
                     "--auto chooses the checkpoint policy, so it takes no --ckpt (got --ckpt "
                     "{})",
                     cfg->ckpt);
      cfg->ckpt = "auto";
      // Over several ranks the stage is the search's too, unless given (Note [Fit a budget]);
      // and the layout, tp x pp x dp, unless --tp or --pp is ("Layouts").
      if (cfg->ranks > 1 && cmd->get_option("--zero")->count() == 0) cfg->zero_auto = true;
      cfg->auto_layout = cfg->ranks > 1 && cmd->get_option("--tp")->count() == 0 &&
                         cmd->get_option("--pp")->count() == 0;
    }
    const std::string attention_line =
        fp16_attention_default(*cfg, cmd->get_option("--attention")->count() > 0);
    if (!*json && !attention_line.empty()) fmt::print(stderr, "memfit: {}\n", attention_line);
    // The checkpoint the run starts from (--resume, --init-from), read once for every step below.
    StartingCheckpoint start(*cfg);
    auto given = [&](const char* name) { return cmd->get_option(name)->count() > 0; };
    adopt_lora_from(*cfg, start.model().config,
                    {given("--lora-rank"), given("--lora-alpha"), given("--lora-targets")});
    const std::string precision_note = resolve_precision(*cfg, start);
    // The route of the precision as resolved (bf16's widened matmuls); an unknown name is the
    // run's to refuse (resolve_run), after these lines.
    if (!*json)
      print_precision_route(cfg->precision == "bf16"  ? Precision::bf16
                            : cfg->precision == "fp8" ? Precision::fp8
                                                      : Precision::fp32,
                            precision_note);
    if (!*json && cfg->ranks > 1 && !dist::built_with_mpi())
      fmt::print("note: this memfit was built without MPI, so it cannot run the {} ranks planned "
                 "here: install libopenmpi-dev and rebuild (scripts/setup.sh does)\n",
                 cfg->ranks);
    if (*max_model) check_max_model_config(*cfg);
    // The options, checked and parsed once: everything below reads the RunSpec.
    RunSpec spec = resolve_run(*cfg, start);
    // --auto and --max-model may keep bf16 gradients and then drop the master weights where
    // nothing fits as asked, unless either was given (Note [Fit a budget], "Precision levers").
    spec.precision_levers_open =
        (*auto_ckpt || *max_model) && spec.precision.precision == Precision::bf16 &&
        !spec.resumed && !spec.lora.enabled() && !spec.update_in_backward &&
        cmd->get_option("--master-weights")->count() == 0 &&
        cmd->get_option("--grad-dtype")->count() == 0;
    // --max-model with a policy given plans every member with it (else each one's fastest).
    std::optional<CheckpointPolicy> policy;
    if (cmd->get_option("--ckpt")->count() > 0 && !spec.ckpt_auto) policy = spec.ckpt;
    const bool fits = *max_model            ? plan_max_model(spec, *json, policy)
                      : cfg->needs_planner() ? plan_with_search(*cfg, spec, *json, start)
                                             : plan_fixed(spec, *json);
    if (!fits) {
      std::fflush(stdout);
      throw ExitCode{kDoesNotFit};
    }
  });
}

}  // namespace memfit::cli
