#include "memfit/train/trainer.h"

#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "memfit/core/scoped_threads.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/checkpoint_dir.h"
#include "memfit/io/created_directories.h"
#include "memfit/io/data/data_loader.h"
#include "memfit/io/checkpoint/lora_adapter.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/data/prepare.h"
#include "memfit/io/checkpoint/zero_checkpoint.h"
#include "memfit/memory/rss.h"
#include "memfit/model/activation_plan.h"
#include "memfit/model/transformer.h"
#include "memfit/dist/grad_sync.h"
#include "memfit/dist/zero/zero_state.h"
#include "memfit/offload/offloaded_grads.h"
#include "memfit/offload/offloaded_optimizer.h"
#include "memfit/offload/param_file.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/profile/leak_check.h"
#include "memfit/profile/profiler.h"
#include "memfit/state/state_placement.h"
#include "memfit/train/run_setup.h"
#include "memfit/train/grad_clip.h"
#include "memfit/train/interrupt.h"
#include "memfit/train/offload_disk.h"
#include "memfit/train/progress.h"
#include "memfit/train/resume_state.h"
#include "memfit/train/run_agreement.h"
#include "memfit/train/update.h"

namespace memfit {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// What a resumed run must agree with, and where it stands. No random numbers are drawn during
// training other than through the data order, which is a function of (seed, epoch), so the
// seed and the loader's position are the whole RNG state.
json trainer_state(const TrainConfig& c, int64_t step, int64_t data_position,
                   int64_t data_tokens, int T, const DynamicLossScaler* scaler,
                   const std::string& tokenizer) {
  json s = {{"step", step},
          {"data_position", data_position},
          {"seed", c.seed},
          {"rng", {{"kind", "data order: mt19937_64 Fisher-Yates per epoch"}, {"seed", c.seed}}},
          {"batch", c.batch},
          {"grad_accum", c.grad_accum},
          {"seq_len", T},
          {"steps", c.steps},
          {"shuffle", c.shuffle},
          {"repeat_batch", c.repeat_batch},
          {"optim", c.optim.name},
          {"attention", c.attention},
          {"ckpt", c.ckpt},
          {"act_compress", c.act_compress.empty() ? "none" : c.act_compress},
          {"precision", c.precision},
          {"zero", c.zero},
          {"master_weights", c.master_weights},
          {"schedule", c.schedule.to_json()}};
  if (scaler) s["loss_scaler"] = scaler->to_json();
  if (c.lora.enabled())
    s["lora"] = {{"rank", c.lora.rank}, {"alpha", c.lora.alpha}, {"targets", c.lora.targets}};
  // The training data's size, which a resume checks (-1: not known, no loader and an older file).
  if (data_tokens >= 0) s["data_tokens"] = data_tokens;
  // The data's tokenizer (its dataset.json's), which memfit sample then decodes with.
  if (!tokenizer.empty()) s["tokenizer"] = tokenizer;
  return s;
}

double unigram_entropy(io::DataLoader& loader, int vocab) {
  std::vector<int64_t> counts(static_cast<size_t>(vocab), 0);
  const int64_t n = loader.num_tokens();
  loader.scan([&](std::span<const int32_t> tokens) {
    for (int32_t t : tokens) ++counts[t];
  });
  double h = 0;
  for (int64_t k : counts)
    if (k) h -= double(k) / n * std::log(double(k) / n);
  return h;
}

json memory_json(const CategoryBytes& bytes) {
  json j = json::object();
  for (Category c : kAllCategories)
    if (bytes[static_cast<size_t>(c)]) j[std::string(category_name(c))] = bytes[static_cast<size_t>(c)];
  return j;
}

// The run as the profile's summary and page describe it.
json run_json(const RunSpec& spec, const TrainConfig& c, const StatePlacement& placement) {
  const int rank = placement.rank(), ranks = placement.world();
  const ModelConfig& m = spec.model;
  // The preset, or where a checkpoint gave the model, the checkpoint.
  const std::string& from = !c.resume_dir.empty() ? c.resume_dir : c.init_from;
  const std::string model = !c.model.empty() || from.empty() ? c.model_name() : from;
  const std::string shape = fmt::format("{} x {}", m.n_layer, m.d_model);
  return {{"title", fmt::format("{} ({}), {} x {} tokens{}, {}, --ckpt {}{}", model, shape,
                                spec.batch, spec.T,
                                spec.grad_accum > 1 ? fmt::format(" x {}", spec.grad_accum) : "",
                                precision_name(spec.precision.precision), spec.ckpt.name(),
                                ranks > 1 ? fmt::format(", rank {} of {}{}", rank, ranks,
                                                        placement.stage() > 0
                                                            ? fmt::format(", --zero {}",
                                                                          placement.stage())
                                                            : "")
                                          : "")},
          {"model", model},
          {"family", std::string(family_name(m.family))},
          {"n_layer", m.n_layer},
          {"d_model", m.d_model},
          {"n_head", m.n_head},
          {"batch", spec.batch},
          {"seq_len", spec.T},
          {"grad_accum", spec.grad_accum},
          {"precision", std::string(precision_name(spec.precision.precision))},
          {"ckpt", spec.ckpt.name()},
          {"attention", std::string(attention_kind_name(spec.attention))},
          {"optim", c.optim.name},
          {"rank", rank},
          {"ranks", ranks},
          {"zero", placement.stage()}};
}

// The planner's prediction for this rank.
PlanReport rank_plan(const RunSpec& spec, int rank) { return plan_memory(spec, rank); }

// Keeps the JSON lines of `file` whose "step" is at most `step` (and drops a torn last line),
// rewriting it atomically; a missing file stays missing.
void truncate_log_after(const std::string& file, int64_t step) {
  if (!fs::exists(file)) return;
  std::ifstream in(file);
  std::string kept;
  for (std::string line; std::getline(in, line);) {
    const json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() &&
        j["step"].get<int64_t>() <= step)
      kept += line + '\n';
  }
  io::write_file_atomic(file, kept);
}

}  // namespace

TrainSummary train(const TrainConfig& cfg_in) {
  dist::ProcessGrid grid(dist::make_single_communicator(), dist::GridShape{});
  return train(cfg_in, grid);
}

TrainSummary train(const TrainConfig& cfg_in, dist::ProcessGrid& grid) {
  // Data parallelism: every rank runs this with its own rows of each global micro-batch
  // (docs/data.md, "Ranks"); gradients, the loss and the evaluation are summed over the data
  // group (`comm`, W ranks); the world's rank 0 alone logs, shows progress and saves (the
  // weights are the same on every rank). The ranks agree on the run over the whole world.
  dist::Communicator& comm = grid.data();
  const int W = comm.size();
  const bool lead = grid.world().rank() == 0;
  TrainConfig planned = cfg_in;
  planned.ranks = W;
  // --ckpt auto and --auto-batch become the planner's choice first: the run, its checkpoints and
  // trainer_state.json have a policy and a micro-batch, never "auto". `spec` is the run as the
  // planner planned it (the model, shapes, precision, policy, budget), `cfg` the rest.
  AutoResolution resolved = resolve_auto(planned);  // and --precision auto, resolved
  adopt_lead_choice(resolved, grid.world());  // rank 0's choice is every rank's
  TrainConfig cfg = resolved.config;
  const RunSpec& spec = resolved.spec;
  cfg.schedule.total = cfg.steps;
  // Ranks that disagree about the run fail here, every rank alike, before anything is built
  // (Note [Failures] in docs/notes/zero.md).
  if (grid.world().size() > 1)
    dist::check_ranks_agree(grid.world(), run_agreement_fields(cfg, spec, resolved.location));
  // A --save the run could not write fails now, not after the steps whose result it keeps. Rank
  // 0's check (its probe's name has its pid, which another host may share); a rank's error ends
  // every rank (Note [Failures] in docs/notes/zero.md).
  if (lead && !cfg.save_dir.empty()) io::check_checkpoint_writable(cfg.save_dir);
  // --threads for this run only (the caller's count is back when it returns).
  const ScopedThreads run_threads(spec.threads);
  const auto wall_start = std::chrono::steady_clock::now();
  MemoryPool pool(spec.mem_limit ? spec.mem_limit : kUnlimited);
  // The collectives' buffers are this run's pool's (Category::comm), until it ends.
  comm.set_pool(&pool);
  struct PoolRelease {
    dist::Communicator& comm;
    ~PoolRelease() { comm.set_pool(nullptr); }
  } pool_release{comm};
  // --profile: the pool's event log from here on, the step's phases and buffers over the first
  // --profile-steps steps (profile/profiler.h).
  std::unique_ptr<profile::Profiler> profiler;
  if (!cfg.profile_dir.empty())
    profiler = std::make_unique<profile::Profiler>(
        profile::ProfileOptions{cfg.profile_dir, cfg.profile_steps, comm.rank(), W}, pool,
        wall_start);
  // The leak check: the pool's live bytes by tag at every step boundary (profile/leak_check.h).
  profile::LeakCheck leaks;
  std::vector<Allocation> test_leaks;  // cfg.test_leak_bytes: the tests' deliberate leak
  const uint64_t max_shard_bytes = io::parse_max_shard_size(cfg.max_shard_size);

  const bool resume = spec.resumed;
  const io::CheckpointLocation& location = resolved.location;
  if (location.recovered) fmt::print(stderr, "memfit: {}\n", location.note);
  const ModelConfig& mc = spec.model;
  const int T = spec.T, B = spec.batch;

  // Where this rank's state lives (Note [State placement]): with several ranks the layout cut
  // into one shard per rank where every optimizer state allows (state/shard.h); from stage 1 on
  // this rank's optimizer state and master weights are its shard's alone (owned()), at stage 2
  // its gradients' sums too, at stage 3 its working weights too. With one rank every stage is
  // stage 0. Nothing below decodes the stage.
  const StatePlacement placement(ParamLayout(spec.model), spec.optim, spec.state_options(),
                                 {comm.rank(), W});
  const std::vector<ElementRange>& shards = placement.shards();
  const std::optional<ElementRange> my_shard = placement.owned();
  // --offload-optimizer nvme: the optimizer state and the FP32 master weights live in files and
  // the update streams them (offload/offloaded_optimizer.h); the model keeps its working weights.
  // Under ZeRO (stages 1 to 3; RunSpec::check refuses stage 0) each rank offloads its own
  // shard, into its own subdirectory of --offload-dir, so ranks sharing one never collide; the
  // disk check and --disk-limit are per rank (Note [NVMe offload], "Under ZeRO").
  const bool offload = placement.optimizer_in_file();
  const bool master = placement.master().where != Residence::none;
  const fs::path offload_dir = placement.offload_dir();
  // The directories made here (--offload-dir, a rank's subdirectory) go when the run ends, after
  // the files that the objects below remove as they are destroyed, or when it fails first (a
  // disk too small): no empty directory is left (io/created_directories.h).
  io::CreatedDirectories offload_dirs;
  if (offload) offload_dirs.create(offload_dir, "offload", "--offload-dir " + spec.offload.dir);
  const std::string offload_run = fmt::format(
      "memfit-{}-{}", ::getpid(), std::chrono::system_clock::now().time_since_epoch().count());
  // --offload-params nvme: the blocks' working weights in a file beside the optimizer's (at
  // stage 3 this rank's shard of them), read through the model's ring (WeightGather's file
  // source; at stage 3 read, then all-gathered) and written back by the offloaded update.
  // Made before the model, so the model (whose ring the requests use) and its waits for them
  // go first (Note [NVMe offload], "Working weights on disk").
  // Every rank's offload files against the free bytes of the filesystem it shares with the
  // other ranks there, before any file is made (train/offload_disk.h).
  if (placement.optimizer_in_file())
    check_offload_disk(comm, offload_dir, plan_memory(spec, comm.rank()).disk_bytes);
  std::unique_ptr<offload::ParamFile> param_file;
  if (placement.params_in_file())
    param_file = std::make_unique<offload::ParamFile>(
        ParamLayout(mc), half_dtype(spec.precision.precision), placement.persist_threshold(),
        offload_dir, offload_run, placement.params_file_range());
  // --offload-grads nvme (one process: RunSpec::check): the gradients per unit in a file,
  // written as each unit's backward ends and read by the update; no slab in RAM (Note [NVMe
  // offload], "Gradients on disk").
  std::unique_ptr<GradStore> grad_store;
  offload::OffloadedGrads* grads_file = nullptr;
  if (placement.grads_in_file()) {
    auto g = std::make_unique<offload::OffloadedGrads>(ParamLayout(mc), pool, offload_dir,
                                                       offload_run, spec.grad_accum,
                                                       spec.grad_dtype);
    grads_file = g.get();
    grad_store = std::move(g);
  }
  // The model's state as the placement puts it, and the services that keep what the model does
  // not hold (dist/zero/zero_state.h): stage 3's gathers (Note [ZeRO stage 3]) or the working
  // weights' file; each micro-batch's gradients reduced unit by unit as the backward ends each
  // (stages 2-3, 0-1 under --sync-every-micro-batch, and bf16 gradients at every stage: Notes
  // [Sharded gradients], [Gradients in bf16]) or the gradients' file. `zero` keeps the concrete
  // ones this loop uses besides: the sums over ranks, the offloaded working weights.
  ZeroServices zero;
  Transformer gpt(mc, pool, spec.precision,
                  zero_model_state(placement, comm, param_file.get(), std::move(grad_store),
                                   &zero));
  std::unique_ptr<DynamicLossScaler> scaler;
  if (gpt.precision().precision == Precision::fp16)
    scaler = std::make_unique<DynamicLossScaler>(cfg.loss_scaler);
  // LoRA (Note [LoRA]): the adapters, drawn from the seed; the optimizer steps them alone.
  if (spec.lora.enabled()) gpt.add_lora(spec.lora, cfg.seed);
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<offload::OffloadedOptimizer> off;
  if (offload && spec.offload.disk_limit) {
    const uint64_t need =
        offload::make_offload_layout(gpt.layout(), spec.optim, master,
                                     offload::kMaxPieceElements, my_shard)
            .disk_total() +
        (param_file ? param_file->layout().file_bytes : 0) +
        (grads_file ? grads_file->file_layout().file_bytes : 0);
    if (need > spec.offload.disk_limit)
      MEMFIT_THROW(ConfigError, "config",
                   "--disk-limit {} bytes ({:.2f} GiB): the offload files need {} bytes ({:.2f} "
                   "GiB){}",
                   spec.offload.disk_limit, spec.offload.disk_limit / 1073741824.0, need,
                   need / 1073741824.0,
                   W > 1 ? fmt::format(" on rank {} (the limit is per rank)", comm.rank()) : "");
  }
  if (offload)
    off = std::make_unique<offload::OffloadedOptimizer>(
        spec.optim, gpt.layout(), master, pool, offload_dir, offload_run,
        offload::kMaxPieceElements, my_shard);
  else
    opt = make_optimizer(spec.optim, gpt.lora() ? gpt.lora()->param_layout() : gpt.layout(),
                         &pool, my_shard);
  // The offload files' bytes by category (master, optimizer; params with --offload-params,
  // grads with --offload-grads).
  auto offload_files = [&] {
    CategoryBytes disk = off ? off->file_bytes() : CategoryBytes{};
    if (param_file)
      disk[static_cast<size_t>(Category::params)] += fs::file_size(param_file->file().path());
    if (grads_file)
      disk[static_cast<size_t>(Category::grads)] += fs::file_size(grads_file->file().path());
    return disk;
  };
  // bf16 gradients: the update widens them a chunk at a time into one f32 buffer (Note
  // [Gradients in bf16]; the planner counts it under staging).
  if (spec.grad_dtype == DType::bf16) {
    const Tensor widen =
        Tensor::empty(pool, {std::max<int64_t>(1, grad_widen_elements(spec.optim, gpt.layout()))},
                      DType::f32, Category::staging, "grads.widen");
    if (off) off->set_grad_widen(widen);
    else opt->set_grad_widen(widen);
  }
  // The set-up fills the weights of record and the working copy by range (Note [Set-up by
  // range] in docs/notes/zero.md): this rank's range of the initial weights drawn, or of each
  // tensor read from the checkpoint, straight into the f32 weights of record (the master
  // weights, or f32 working weights; offloaded master weights a unit at a time into their
  // file's I/O buffer), the rest of the working copy (stages 1-2: the other ranks' parts; bf16
  // weights of record) through one staging piece no larger than the step's activation arena,
  // so the set-up never holds more than the step (setup_piece_elements).
  const ElementRange my_range = my_shard.value_or(whole_range(gpt.layout()));
  auto my_part = [&](Tensor& slab) { return slab.view(my_range.begin, {my_range.size()}); };
  const int64_t piece =
      setup_piece_elements(plan_step(gpt.config(), B, T, spec.activation_options()));
  Transformer::MasterSink to_master_file;
  if (off && master)
    to_master_file = [&](const Transformer::RangeFill& fill) { off->write_master_from(fill); };
  int64_t start_step = 0, data_position = 0;
  ResumeState resumed;  // the checkpoint's trainer_state.json, when resuming
  const fs::path state_file = location.dir / "trainer_state.json";
  if (!location.dir.empty()) {
    // Into the weights of record, converting F32 <-> BF16 as needed, then the working copy
    // rounded from them: any precision loads any precision's checkpoint.
    if (gpt.whole_weights() && !to_master_file && !gpt.params_offloaded() &&
        io::has_model_weights(location.dir)) {
      // The whole layout, straight into the weights from the files. A stage-0 save's
      // optimizer.safetensors is checked with the weights, all before a byte is copied;
      // sharded state (any other range, or a ZeRO save) is loaded below.
      const bool with_opt = resume && opt && !gpt.lora() &&
                            opt->range() == whole_range(gpt.layout()) &&
                            !io::has_zero_shards(location.dir);
      io::load_checkpoint(location.dir, mc, gpt.layout(), gpt.weights(),
                          with_opt ? opt.get() : nullptr);
      if (resume && opt && !with_opt && !gpt.lora())
        io::load_optimizer_state_any(location.dir, *opt);
      gpt.refresh_working();
    } else {
      // This rank's ranges of each tensor (model.safetensors, Hugging Face's shards, or a ZeRO
      // save's shard files of any world size and stage), read from the mapped files.
      const std::unique_ptr<io::ParamSource> saved = io::open_checkpoint_weights(location.dir, mc);
      gpt.set_weights([&](int64_t from, int64_t to,
                          float* dst) { saved->read_range({from, to}, dst); },
                      piece, to_master_file);
      // ZeRO's shards of any world size and stage, or a whole optimizer.safetensors, cut to
      // this rank's range (io/checkpoint/zero_checkpoint.h).
      if (resume && opt) io::load_optimizer_state_any(location.dir, *opt);
    }
    if (resume && off && (my_shard || io::has_zero_shards(location.dir))) {
      // A shard's part of any saved state (ZeRO's shards of any world size and stage, or a
      // whole optimizer.safetensors), streamed into this rank's files.
      off->load_state(io::SavedOptimizerState(location.dir, off->descriptor(), off->range()));
    } else if (resume && off) {
      const fs::path file = location.dir / io::kOptimizerFile;
      if (!fs::exists(file))
        MEMFIT_THROW(IoError, "checkpoint",
                     "{}: no {}, so the optimizer cannot resume (load the weights alone with "
                     "--init-from to start a fresh optimizer)",
                     location.dir.string(), io::kOptimizerFile);
      off->load_state(file);
    }
    if (resume) {
      resumed = parse_trainer_state(io::read_file_to_string(state_file), cfg, T, state_file);
      if (gpt.lora()) {  // the adapters and their optimizer's state (Note [LoRA])
        io::load_lora_adapter(location.dir, mc, *gpt.lora(), gpt.lora_weights());
        io::load_optimizer_state(location.dir / io::kAdapterOptimizerFile, *opt);
      }
      start_step = resumed.step;
      data_position = resumed.data_position;
      if (scaler && resumed.state.contains("loss_scaler"))
        scaler->load_json(resumed.state["loss_scaler"]);
      if (const std::string note = longer_run_note(resumed, cfg); lead && !note.empty())
        fmt::print(stderr, "memfit: {}\n", note);
      if (const std::string changes = schedule_changes(resumed, cfg); lead && !changes.empty())
        fmt::print(stderr,
                   "memfit: the learning-rate schedule differs from the checkpoint's ({}): it "
                   "continues with this run's, so this is not a bit-identical continuation\n",
                   changes);
    }
  } else {
    gpt.init_weights(cfg.seed, piece, to_master_file);
  }
  gpt.reserve(B, T, spec.activation_options());
  if (profiler) {
    profiler->set_run(run_json(spec, cfg, placement), rank_plan(spec, comm.rank()));
    profiler->recorder()->set_plan(gpt.step_plan());
    gpt.set_step_observer(profiler->recorder());
    // The disk tier and the update's waits on it (Note [Memory profile], per rank, per tier).
    if (off) {
      profiler->set_disk(offload_files());
      off->record_waits(true);
      if (param_file) param_file->record_waits(true);
    }
  }
  auto recorder = [&]() { return profiler ? profiler->recorder() : nullptr; };
  // Data parallelism at stages 0-1: the whole slab's exchange and its receive ring
  // (Category::comm), for the run. Per-unit gradients (stages 2-3, above) reduce themselves,
  // through a receive ring of their own.
  std::optional<dist::GradientSync> sync;
  if (W > 1 && !zero.grads)
    sync.emplace(comm, pool, std::span<float>(gpt.grads().data<float>(), size_t(gpt.grads().numel())),
                 spec.bucket_bytes);
  // The sums over ranks of a float (the loss, the stop flag, evaluation) and the step's gradient
  // bytes, through whichever exchange the run has.
  auto sum_ranks = [&](float x) { return sync ? sync->sum(x) : zero.grads->sum(x); };
  auto take_volume = [&] {
    return sync ? sync->take_volume() : zero.grads->take_volume();
  };
  // How the update sees the ranks: every stage adds the shards' sums of squares in rank order.
  std::optional<RankShards> rank_shards;
  if (W > 1) rank_shards = RankShards{&comm, shards, placement.grads_whole()};

  io::DataLoaderOptions dopt;
  dopt.batch_size = B;
  dopt.seq_len = T;
  dopt.shuffle = cfg.shuffle;
  dopt.seed = cfg.seed;
  dopt.vocab_size = mc.vocab_size;
  dopt.world = W;
  dopt.rank = comm.rank();
  // A preset's vocabulary is the usual mismatch (gpt2-tiny's 512 on GPT-2 tokens): the error
  // names it and the --vocab that fits. A checkpoint's model has its own, which --vocab cannot
  // change.
  if (location.dir.empty())
    dopt.vocab_source = cfg.vocab ? "--vocab" : "preset " + cfg.model_name();
  std::unique_ptr<io::DataLoader> train_data, val_data;
  const int64_t last_step = cfg.stop_after ? std::min(cfg.steps, cfg.stop_after) : cfg.steps;
  if (start_step < last_step) {
    train_data = std::make_unique<io::DataLoader>(io::DataLoader::train(pool, cfg.data_dir, dopt));
    if (resume) check_resume_data(resumed, train_data->num_tokens(), cfg.data_dir, state_file);
    train_data->set_position(data_position);
    if (!io::find_token_shards(cfg.data_dir, "val").empty())
      val_data = std::make_unique<io::DataLoader>(io::DataLoader::val(pool, cfg.data_dir, dopt));
    else if (lead && cfg.eval_every > 0)
      fmt::print(stderr,
                 "memfit: no val_*.bin shards in {}: no validation loss (--eval-every {})\n",
                 cfg.data_dir, cfg.eval_every);
  }

  TrainSummary summary;
  if (train_data) summary.unigram_entropy = unigram_entropy(*train_data, mc.vocab_size);
  // The tokenizer that `memfit prepare` recorded in the data's dataset.json (none for shards
  // from elsewhere); a malformed file is an error naming it.
  std::string data_tokenizer;
  if (train_data)
    if (const auto info = io::read_dataset_info(cfg.data_dir)) data_tokenizer = info->tokenizer;

  std::ofstream log;
  if (lead && !cfg.log_file.empty()) {
    if (auto parent = fs::path(cfg.log_file).parent_path(); !parent.empty()) {
      std::error_code ec;
      fs::create_directories(parent, ec);
      if (ec)
        MEMFIT_THROW(IoError, "train", "--log {}: cannot create {}: {}", cfg.log_file,
                     parent.string(), ec.message());
    }
    // A resume continues the log from the checkpoint's step: the lines of steps after it (run
    // before a kill, and to be run again now) are cut first, so each step appears once.
    if (resume) truncate_log_after(cfg.log_file, start_step);
    log.open(cfg.log_file, resume ? std::ios::app : std::ios::trunc);
    if (!log) MEMFIT_THROW(IoError, "train", "--log {}: cannot open the file", cfg.log_file);
  }
  auto log_line = [&](const json& j) {
    if (lead && log.is_open()) log << j.dump() << '\n' << std::flush;
  };

  // The weights of record, whole, for a save without ZeRO's shards (stage 0), where they are
  // one tensor in RAM. In one process with the weights of record on disk (the offloaded master
  // weights, or without master weights the offloaded working weights: save_streams_weights)
  // model.safetensors is streamed from the files instead (save, below; Note [Streamed save] in
  // docs/notes/checkpoints.md): nothing is read whole, and no other tensor is borrowed. From
  // stage 1 on no rank holds them whole: each writes its range into its shard file
  // (stage_shards), and the save has no model.safetensors (docs/notes/checkpoints.md, "ZeRO's
  // sharded optimizer state").
  const bool streamed_save = save_streams_weights(spec);
  const int64_t save_staging_n =
      save_staging_elements(spec, plan_step(gpt.config(), B, T, spec.activation_options()));
  auto record_for_save = [&]() -> Tensor {
    if (placement.sharded_save() || streamed_save) return Tensor{};
    return gpt.weights();
  };
  // The weights of record's element type, as config.json names it for a sharded save.
  const DType record_dtype = off && master            ? DType::f32
                             : gpt.params_offloaded() ? half_dtype(spec.precision.precision)
                                                      : gpt.weights().dtype();
  // ZeRO's sharded optimizer state (stage >= 1): every rank writes its own shard file (its
  // range of the weights of record and its extents of every state tensor, straight from its
  // tensors: no byte gathered or added) into a staging directory beside the save, a sibling
  // of DIR on the same file system. A barrier, then rank 0's atomic save renames the shard files
  // into its temporary directory and adds the index, so they change with the rest of the
  // checkpoint (docs/notes/checkpoints.md, "ZeRO's sharded optimizer state"). Every rank calls
  // this (collective); rank 0 saves.
  const bool sharded_state = placement.sharded_save();
  const fs::path staging =
      cfg.save_dir.empty() ? fs::path() : fs::path(cfg.save_dir).concat(".zero-staging");
  auto stage_shards = [&] {
    if (!sharded_state) return;
    if (lead) {
      fs::remove_all(staging);  // a crashed save's leftovers
      fs::create_directories(staging);
    }
    comm.barrier();
    const fs::path file = staging / io::zero_shard_file(comm.rank(), W);
    if (off && master) {
      // Offloaded: the shard's master weights and state streamed out of this rank's files (the
      // same bytes as from RAM).
      off->save_shard(file);
    } else if (off && gpt.params_offloaded()) {
      // Without master weights, offloaded working weights (stage 3): the shard's streamed from
      // their file.
      off->save_shard(file, *zero.weights);
    } else if (off) {
      // Without master weights: the working weights (whole at stages 1-2, the shard itself at
      // stage 3) are the weights of record.
      off->save_shard(file, gpt.whole_weights() ? my_part(gpt.weights()) : gpt.weights());
    } else {
      const Tensor weights = gpt.whole_weights()
                                 ? gpt.weights().view(my_shard->begin, {my_shard->size()})
                                 : gpt.weights();
      io::save_zero_shard(file, *opt, weights);
    }
    comm.barrier();  // every shard is on disk before rank 0 moves them into the save
  };
  auto save = [&](int64_t step, const Tensor& record) {
    const auto save_start = std::chrono::steady_clock::now();
    io::CheckpointSaveOptions so;
    // A shard's optimizer state goes into the shard files (stage_shards); stage 0 saves the
    // whole state as optimizer.safetensors (every rank holds the same).
    so.optimizer = sharded_state || gpt.lora() ? nullptr : opt.get();
    // LoRA: the adapters in PEFT's format beside the (unchanged) base weights (Note [LoRA]).
    if (gpt.lora())
      so.write_extra = [&](const fs::path& tmp) {
        io::save_lora_adapter(tmp, mc, *gpt.lora(), gpt.lora_weights());
        io::save_optimizer_state(tmp / io::kAdapterOptimizerFile, *opt);
      };
    if (sharded_state)
      so.write_extra = [&](const fs::path& tmp) {
        for (int r = 0; r < W; ++r)
          fs::rename(staging / io::zero_shard_file(r, W), tmp / io::zero_shard_file(r, W));
        io::write_file_atomic(tmp / io::kZeroIndexFile,
                              io::zero_index_json(off ? off->descriptor() : *opt, placement));
      };
    // Offloaded: optimizer.safetensors streamed out of the files a unit at a time (the same
    // bytes as from RAM).
    if (off && !sharded_state)
      so.write_extra = [&](const fs::path& tmp) { off->save_state(tmp / io::kOptimizerFile); };
    if (sharded_state) so.sharded_weights_dtype = record_dtype;
    // The streamed weights of record: each run of the layout read from its file (a piece of the
    // master file through the offload ring; a block of the working weights through the model's
    // ring, the embeddings and the tail from RAM) and written to its places in
    // model.safetensors; GPT-2's transposed tensors through the planned staging, held for the
    // save alone (save_staging_elements).
    Tensor save_staging;
    if (streamed_save) {
      io::StreamedWeights w;
      w.dtype = record_dtype;
      if (off && master)
        w.stream = [&](ElementRange range, const io::RecordTake& take) {
          off->read_master_range(range, [&](int64_t from, int64_t to, const float* src) {
            take(from, to, src);
          });
        };
      else
        w.stream = [&](ElementRange range, const io::RecordTake& take) {
          zero.weights->read_range(
              range, [&](int64_t from, int64_t to, const char* src) { take(from, to, src); });
        };
      if (save_staging_n > 0)
        save_staging =
            Tensor::empty(pool, {save_staging_n}, DType::f32, Category::staging, "save.staging");
      w.staging = save_staging;
      so.streamed_weights = std::move(w);
    }
    so.max_shard_bytes = max_shard_bytes;
    // The writer's staging from RAM (GPT-2's Conv1D transposes, about 4 MiB at a time) comes
    // from the pool; the planner counts it for a run that saves (plan/memory_plan.cpp).
    so.staging_pool = &pool;
    so.extra_files["trainer_state.json"] =
        trainer_state(cfg, step, train_data ? train_data->position() : data_position,
                      train_data ? train_data->num_tokens() : resumed.data_tokens, T,
                      scaler.get(), data_tokenizer)
            .dump(2);
    // The weights of record: FP32 master weights when they exist, else the bf16 weights of a
    // pure-bf16 run (saved as BF16) or the fp32 ones.
    io::save_checkpoint(cfg.save_dir, mc, gpt.layout(), record, so);
    so.streamed_weights.reset();
    save_staging = Tensor{};
    if (sharded_state) fs::remove(staging);  // emptied by the renames
    // Memory once the save has let go of what it used: the soak benchmark's samples.
    // (And how long rank 0's part of the save took: the streamed save's, with offload.)
    log_line({{"step", step}, {"saved", cfg.save_dir},
              {"save_seconds",
               std::chrono::duration<double>(std::chrono::steady_clock::now() - save_start)
                   .count()},
              {"live_bytes", pool.bytes_current()},
              {"live_allocations", pool.live_allocations()}, {"rss_bytes", process_rss_bytes()},
              {"mem", memory_json(pool.current_breakdown())}});
  };
  // The first eval_batches micro-batches of the validation split, in order. With W ranks a
  // micro-batch is W x B rows and each rank evaluates its B of them (its loader's rows), so the
  // work is split and the mean is over every row, as one process with batch W x B.
  auto evaluate = [&]() -> float {
    if (!val_data) return -1;
    const profile::Scope slice(recorder(), "evaluation", profile::SliceKind::evaluation);
    val_data->set_position(0);
    const int64_t n = std::min<int64_t>(cfg.eval_batches, val_data->batches_per_epoch());
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      const profile::Scope batch(recorder(), fmt::format("evaluation batch {}", i + 1),
                                 profile::SliceKind::micro_batch);
      {
        const profile::Scope data(recorder(), "data", profile::SliceKind::data);
        val_data->next_batch();
      }
      sum += gpt.forward(val_data->inputs(), val_data->targets(), /*training=*/false);
    }
    if (W == 1) return static_cast<float>(sum / n);
    // Stage 3's gathers for the evaluation are not a training step's (comm_bytes).
    gpt.take_gathered_bytes();
    const profile::Scope all(recorder(), "loss all-reduce", profile::SliceKind::collective);
    return sum_ranks(static_cast<float>(sum)) / static_cast<float>(n * W);
  };

  Progress progress(last_step, stderr, std::max<int64_t>(1, last_step / 20));
  const InterruptScope interrupts;  // SIGINT/SIGTERM: stop after this step, then save as below
  auto last_save = std::chrono::steady_clock::now();
  std::vector<double> rates;
  const double tokens_per_step = double(B) * T * spec.grad_accum * W;  // every rank's
  int64_t saved_at = -1;
  uint64_t last_step_io = 0;  // offload: the last step's bytes read and written (this rank)
  gpt.take_gathered_bytes();  // stage 3: the gathers after initialisation or loading
  // --offload-params under --profile: the waits for the working weights' file, as io slices
  // inside the slice open when they are handed over (a micro-batch's, the optimizer's).
  auto params_io_waits = [&] {
    if (!param_file) return;
    for (const offload::IoWait& w : param_file->take_waits())
      if (profile::StepRecorder* r = recorder())
        r->add("params io wait", profile::SliceKind::io_wait, w.t0, w.t1);
  };
  for (int64_t step = start_step; step < last_step; ++step) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.set_phase(fmt::format("step {}", step + 1));
    if (profiler) profiler->step_begin(step + 1);
    if (recorder()) recorder()->set_step(step + 1);
    std::optional<profile::Scope> step_slice;
    step_slice.emplace(recorder(), fmt::format("step {}", step + 1), profile::SliceKind::step);
    gpt.zero_grad();
    const offload::IoStats io_before = off ? off->stats() : offload::IoStats{};
    const offload::ParamIoStats params_before = offload::param_io_stats(param_file.get());
    const offload::IoStats grads_before = grads_file ? grads_file->stats() : offload::IoStats{};
    const uint64_t grads_backward_before = grads_file ? grads_file->backward_bytes() : 0;
    // fp16: the last backward unscales each offloaded unit as the update in RAM unscales the
    // slab, by the same scale.
    if (grads_file)
      grads_file->set_unscale(scaler ? std::optional<float>(scaler->inv_scale()) : std::nullopt);
    double loss_sum = 0;
    const float loss_scale = scaler ? scaler->scale() : 1.0f;
    for (int m = 0; m < spec.grad_accum; ++m) {
      const profile::Scope batch(recorder(), fmt::format("micro-batch {}", m + 1),
                                 profile::SliceKind::micro_batch);
      {
        const profile::Scope data(recorder(), "data", profile::SliceKind::data);
        train_data->next_batch();
      }
      loss_sum += gpt.forward(train_data->inputs(), train_data->targets(), /*training=*/true,
                              loss_scale);
      // The last micro-batch's backward finishes the gradients: data parallelism sums each
      // bucket over the ranks as soon as the backward has finished it. (Per-unit gradients are
      // reduced by every backward.)
      if (sync && m + 1 == spec.grad_accum)
        gpt.backward([&](int64_t from) { sync->final_from(from); });
      else
        gpt.backward();
      params_io_waits();  // this micro-batch's, inside its slice
    }
    // --repeat-batch: back to the run's first micro-batch, so the next step reads the same rows
    // and a save records that position (a resume repeats the same batch).
    if (cfg.repeat_batch) train_data->set_position(data_position);
    if (W > 1) {
      // The buckets the backward did not finish in time, then the loss over every rank.
      const profile::Scope all(recorder(), "gradient all-reduce", profile::SliceKind::collective);
      if (sync) sync->finish();
      loss_sum = sum_ranks(static_cast<float>(loss_sum));
    }
    const float loss = static_cast<float>(loss_sum / (spec.grad_accum * W));
    // A step skipped for an fp16 overflow does not advance the schedule (loss_scaler.h): its
    // position is the number of steps that updated, which the scaler's state keeps over resumes.
    const float lr = cfg.schedule.at(step - (scaler ? scaler->skipped() : 0));
    // fp16's scaler absorbs a non-finite loss as an overflow (the step is skipped); in fp32 and
    // bf16 nothing can, so the run stops before anything is saved over the last checkpoint.
    UpdateOutcome update;
    int64_t update_gathered = 0;  // the offloaded update's all-gather (ZeRO)
    if (!scaler && !std::isfinite(loss))
      update.non_finite = true;
    else {
      const profile::Scope slice(recorder(), "optimizer", profile::SliceKind::optimizer);
      if (off)
        update = apply_update(
            gpt,
            [&](float rate, float scale) {
              // This rank's range of the working weights and gradients (the whole layout in
              // one process); under ZeRO stages 1-2 the updated working weights are then
              // all-gathered. At stage 3 the working weights are the shard itself, and only the
              // persistent units are gathered again, as the in-RAM update does (counted by the
              // model: take_gathered_bytes).
              // With --offload-grads each piece's gradients are read from their file.
              if (gpt.params_offloaded()) {
                // Each block's new working weights written back to its file.
                if (grads_file)
                  off->step(*zero.weights, *grads_file, rate, scale);
                else
                  off->step(*zero.weights, gpt.grad_sums(my_range), rate, scale);
              } else {
                Tensor working =
                    gpt.params_sharded() ? gpt.params() : my_part(gpt.params());
                if (grads_file)
                  off->step(working, *grads_file, rate, scale);
                else
                  off->step(working, gpt.grad_sums(my_range), rate, scale);
              }
              if (grads_file) grads_file->set_step(off->steps_taken());
              update_gathered =
                  publish_working_weights(gpt, my_shard ? &*rank_shards : nullptr);
              params_io_waits();  // the update's, on the working weights' file
              for (const offload::IoWait& w : off->take_waits())
                if (profile::StepRecorder* r = recorder())
                  r->add("io wait", profile::SliceKind::io_wait, w.t0, w.t1);
            },
            scaler.get(), lr, cfg.clip, spec.grad_accum * W,
            rank_shards ? &*rank_shards : nullptr);
      else
        update = apply_update(gpt, *opt, scaler.get(), lr, cfg.clip, spec.grad_accum * W,
                              rank_shards ? &*rank_shards : nullptr);
    }
    // An overflow at the scale's floor is not something a smaller scale can fix (a non-finite
    // weight, say): stop as fp32 and bf16 do instead of skipping every step from here on.
    if (update.skipped && loss_scale <= cfg.loss_scaler.min_scale) update.non_finite = true;
    if (update.non_finite) {
      const std::string culprit = gpt.first_non_finite();
      MEMFIT_THROW(Error, "train",
                   "step {}: the {} became non-finite (loss {}); the first non-finite tensor is "
                   "{}. Stopping without saving over the last checkpoint{}",
                   step + 1, std::isfinite(loss) ? "gradient" : "loss", loss,
                   culprit.empty() ? "not found (the loss itself)" : culprit,
                   saved_at > 0 ? fmt::format(" (step {})", saved_at) : "");
    }
    const double norm = update.grad_norm;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const double rate = tokens_per_step / seconds;
    rates.push_back(rate);
    summary.losses.push_back(loss);
    summary.last_loss = loss;
    ++summary.steps_run;

    const size_t rss = process_rss_bytes();
    json line = {{"step", step + 1},          {"loss", loss},
                 {"lr", lr},                  {"grad_norm", norm},
                 {"tokens_per_s", rate},      {"step_seconds", seconds},
                 {"peak_bytes", pool.bytes_peak()}, {"mem", memory_json(pool.current_breakdown())},
                 {"live_bytes", pool.bytes_current()}, {"live_allocations", pool.live_allocations()},
                 {"rss_bytes", rss}, {"outside_pool_bytes", int64_t(rss) - int64_t(pool.bytes_current())}};
    if (W > 1) {
      // The bytes this step's collectives covered, by kind (plan: comm_per_step).
      dist::CommVolume v = take_volume();
      // Stage 3: the step's gathers of working weights (the micro-batches' blocks, the
      // persistent units after the update).
      v.all_gather = update.gathered_bytes + update_gathered + gpt.take_gathered_bytes();
      line["comm_bytes"] = {{"all_reduce", v.all_reduce},
                            {"reduce_scatter", v.reduce_scatter},
                            {"all_gather", v.all_gather}};
    }
    if (off) {
      // This step's offload I/O: bytes moved, and the time the update waited for the disk.
      const offload::IoStats& io = off->stats();
      // With --offload-params the working weights' file too (its reads during the
      // micro-batches, the update's write-back), also apart under "params"; with
      // --offload-grads the gradients' (the backward's writes and reads back, the update's
      // reads), also apart under "grads".
      const offload::ParamIoStats p =
          offload::param_io_stats(param_file.get()) - params_before;
      const offload::IoStats g = grads_file ? grads_file->stats() : offload::IoStats{};
      const uint64_t g_read = g.bytes_read - grads_before.bytes_read,
                     g_written = g.bytes_written - grads_before.bytes_written;
      const uint64_t read = io.bytes_read - io_before.bytes_read + p.read_bytes + g_read,
                     written =
                         io.bytes_written - io_before.bytes_written + p.written_bytes + g_written;
      last_step_io = read + written;
      line["offload"] = {{"read_bytes", read},
                         {"written_bytes", written},
                         {"wait_seconds", io.wait_seconds - io_before.wait_seconds},
                         {"update_seconds", io.update_seconds - io_before.update_seconds},
                         {"engine", off->engine().name()}};
      if (param_file)
        line["offload"]["params"] = {{"read_bytes", p.read_bytes},
                                     {"written_bytes", p.written_bytes},
                                     {"wait_seconds", p.wait_seconds}};
      if (grads_file)
        line["offload"]["grads"] = {
            {"read_bytes", g_read},
            {"written_bytes", g_written},
            {"wait_seconds", g.wait_seconds - grads_before.wait_seconds},
            {"backward_bytes", grads_file->backward_bytes() - grads_backward_before}};
    }
    if (scaler) {
      line["loss_scale"] = loss_scale;
      line["skipped"] = update.skipped;
      if (update.skipped) line["grad_norm"] = nullptr;
      summary.skipped_steps += update.skipped;
    }
    log_line(line);
    std::string text = fmt::format("loss {:.4f} | lr {:.2e} | {:.0f} tok/s | mem {} (peak {})",
                                   loss, lr, rate, format_mib(pool.bytes_current()),
                                   format_mib(pool.bytes_peak()));
    if (scaler)
      text += fmt::format(" | scale {:g}{}", loss_scale, update.skipped ? " (skipped)" : "");
    const bool last = step + 1 == last_step;
    if (val_data && ((cfg.eval_every && (step + 1) % cfg.eval_every == 0) || last)) {
      summary.last_val_loss = evaluate();
      log_line({{"step", step + 1}, {"val_loss", summary.last_val_loss}});
      text += fmt::format(" | val {:.4f}", summary.last_val_loss);
    }
    if (lead) progress.update(step + 1, text);
    const double minutes_since_save =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - last_save).count() / 60;
    bool due = (cfg.save_every && (step + 1) % cfg.save_every == 0) ||
               (cfg.save_every_minutes > 0 && minutes_since_save >= cfg.save_every_minutes);
    // Sharded master weights are gathered, and sharded state written, by every rank for a save
    // (collectives): the ranks' clocks must not decide apart, so rank 0's decision is everyone's.
    if ((!gpt.whole_weights() || sharded_state) && !cfg.save_dir.empty() &&
        cfg.save_every_minutes > 0) {
      char d = due;
      comm.broadcast(&d, 1, 0);
      due = d != 0;
    }
    if (!cfg.save_dir.empty() && due && !last) {
      const profile::Scope slice(recorder(), "save", profile::SliceKind::save);
      const Tensor record = record_for_save();
      stage_shards();
      if (lead) save(step + 1, record);
      saved_at = step + 1;
      last_save = std::chrono::steady_clock::now();
    }
    // The tests' deliberate leak, from the second step on.
    if (cfg.test_leak_bytes > 0 && step > start_step)
      test_leaks.push_back(
          pool.allocate(static_cast<size_t>(cfg.test_leak_bytes), Category::workspace, "test.leak"));
    step_slice.reset();
    if (profiler && profiler->step_end(step + 1)) {
      gpt.set_step_observer(nullptr);
      if (off) off->record_waits(false);
      if (param_file) param_file->record_waits(false);
    }
    leaks.boundary(step + 1, pool, process_rss_bytes());
    summary.interrupted_by = interrupt_signal();
    if (W > 1) {
      // Every rank stops after the same step: at the first where any rank was signalled.
      const float any = sum_ranks(summary.interrupted_by ? 1.0f : 0.0f);
      if (any > 0 && !summary.interrupted_by) summary.interrupted_by = SIGTERM;
    }
    if (summary.interrupted_by) break;
  }
  if (lead) progress.finish();
  const int64_t final_step = start_step + summary.steps_run;
  if (!cfg.save_dir.empty() && saved_at != final_step) {
    const Tensor record = record_for_save();
    stage_shards();
    if (lead) save(final_step, record);
  }
  comm.barrier();  // the save is complete before any rank reports the run done
  if (W > 1) {
    // Every rank's peak by category, in rank 0's log: what `memfit plan --world-size W` predicts
    // per rank (ZeRO shards and receive buffers differ between ranks).
    // With offload also each rank's files by category and its last step's I/O (the plan's
    // per-rank offload section).
    struct RankPeak {
      size_t peak;
      CategoryBytes by_category;
      CategoryBytes disk;
      uint64_t io_bytes;
    };
    std::vector<RankPeak> peaks(static_cast<size_t>(W));
    RankPeak& mine = peaks[static_cast<size_t>(comm.rank())];
    mine = {pool.bytes_peak(), pool.peak_breakdown(), offload_files(), last_step_io};
    comm.all_gather(&mine, peaks.data(), std::vector<int64_t>(static_cast<size_t>(W), 1),
                    sizeof(RankPeak));
    json ranks = json::array();
    for (int q = 0; q < W; ++q) {
      const RankPeak& p = peaks[static_cast<size_t>(q)];
      json rank = {{"rank", q}, {"peak_bytes", p.peak}, {"mem", memory_json(p.by_category)}};
      if (off) rank["offload"] = {{"disk", memory_json(p.disk)}, {"io_bytes_per_step", p.io_bytes}};
      ranks.push_back(std::move(rank));
    }
    log_line({{"zero", placement.stage()}, {"ranks", ranks}});
  }
  summary.saved = !cfg.save_dir.empty();

  if (!rates.empty()) {
    std::sort(rates.begin(), rates.end());
    summary.median_tokens_per_s = rates[rates.size() / 2];
  }
  summary.last_step = final_step;
  summary.rank = comm.rank();
  summary.ckpt = spec.ckpt.name();
  summary.act_compress = act_compress_name(spec.act_compress);
  summary.batch = spec.batch;
  summary.grad_accum = spec.grad_accum;
  summary.peak_bytes = pool.bytes_peak();
  summary.peak_by_category = pool.peak_breakdown();
  if (profiler) {
    gpt.set_step_observer(nullptr);
    profiler->finish();  // a run shorter than the window
    summary.profile_dir = profiler->dir().string();
    summary.profile_text = profiler->text();
  }
  summary.leak = leaks.report();
  if (profiler)
    io::write_file_atomic(profiler->dir() / "leak.json", summary.leak.to_json().dump(1));
  summary.wall_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - wall_start).count();
  return summary;
}

}  // namespace memfit
