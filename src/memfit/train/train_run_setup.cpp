// A run's set-up (train/train_run.h): the pool and the profiler, where this rank's state lives
// and the objects that hold it (the offload files, the model, the optimizer), the weights, the
// step's reservation, the gradients' exchange, the data and the log, in that order.
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/data/prepare.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/train/offload_disk.h"
#include "memfit/train/train_run.h"

namespace memfit {

namespace fs = std::filesystem;

TrainRun::TrainRun(dist::ProcessGrid& grid_in, const TrainSpec& spec_in)
    : grid(grid_in),
      comm(grid_in.data()),
      W(comm.size()),
      lead(grid_in.world().rank() == 0),
      settings(spec_in),
      spec(settings.run),
      location(settings.checkpoint.location),
      resume(settings.checkpoint.resume),
      mc(spec.model),
      T(spec.T),
      B(spec.batch),
      run_threads(spec.threads),
      wall_start(std::chrono::steady_clock::now()),
      pool(spec.mem_limit ? spec.mem_limit : kUnlimited),
      pool_release{(comm.set_pool(&pool), comm)},
      // With several ranks the layout cut into one shard per rank where every optimizer state
      // allows (state/shard.h); from stage 1 on this rank's optimizer state and master weights
      // are its shard's alone (owned()), at stage 2 its gradients' sums too, at stage 3 its
      // working weights too. With one rank every stage is stage 0.
      placement(ParamLayout(spec.model), spec.optim, spec.state_options(), {comm.rank(), W}),
      my_shard(placement.owned()),
      // --offload-optimizer nvme: the optimizer state and the FP32 master weights live in files
      // and the update streams them (offload/offloaded_optimizer.h); the model keeps its working
      // weights. Under ZeRO (stages 1 to 3; RunSpec::check refuses stage 0) each rank offloads
      // its own shard, into its own subdirectory of --offload-dir, so ranks sharing one never
      // collide; the disk check and --disk-limit are per rank (Note [NVMe offload], "Under
      // ZeRO").
      offload(placement.optimizer_in_file()),
      master(placement.master().where != Residence::none),
      offload_dir(placement.offload_dir()) {
  start_profiler();
  if (location.recovered) fmt::print(stderr, "memfit: {}\n", location.note);
  make_state_files();
  make_backward_update();
  make_model();
  create_optimizer();
  make_grad_widen();
  load_or_init();
  prepare_step();
  open_data();
  open_log();
}

// --profile: the pool's event log from here on, the step's phases and buffers over the first
// --profile-steps steps (profile/profiler.h).
void TrainRun::start_profiler() {
  if (!settings.profile_dir.empty())
    profiler = std::make_unique<profile::Profiler>(
        profile::ProfileOptions{settings.profile_dir, settings.profile_steps, comm.rank(), W}, pool,
        wall_start);
}

// The offload directories and the files made before the model: --offload-params' working
// weights and --offload-grads' gradients.
void TrainRun::make_state_files() {
  // The directories made here (--offload-dir, a rank's subdirectory) go when the run ends, after
  // the files that the objects below remove as they are destroyed, or when it fails first (a
  // disk too small): no empty directory is left (io/created_directories.h).
  if (offload) offload_dirs.create(offload_dir, "offload", "--offload-dir " + spec.offload.dir);
  offload_run = fmt::format("memfit-{}-{}", ::getpid(),
                            std::chrono::system_clock::now().time_since_epoch().count());
  // --offload-params nvme: the blocks' working weights in a file beside the optimizer's (at
  // stage 3 this rank's shard of them), read through the model's ring (WeightGather's file
  // source; at stage 3 read, then all-gathered) and written back by the offloaded update.
  // Made before the model, so the model (whose ring the requests use) and its waits for them
  // go first (Note [NVMe offload], "Working weights on disk").
  // Every rank's offload files against the free bytes of the filesystem it shares with the
  // other ranks there, before any file is made (train/offload_disk.h).
  if (placement.optimizer_in_file())
    check_offload_disk(comm, offload_dir, plan_memory(spec, comm.rank()).disk_bytes);
  if (placement.params_in_file())
    param_file = std::make_unique<offload::ParamFile>(
        ParamLayout(mc), half_dtype(spec.precision.precision), placement.persist_threshold(),
        offload_dir, offload_run, placement.params_file_range());
  // --offload-grads nvme (one process: RunSpec::check): the gradients per unit in a file,
  // written as each unit's backward ends and read by the update; no slab in RAM (Note [NVMe
  // offload], "Gradients on disk").
  if (placement.grads_in_file()) {
    auto g = std::make_unique<offload::OffloadedGrads>(ParamLayout(mc), pool, offload_dir,
                                                       offload_run, spec.grad_accum,
                                                       spec.grad_dtype);
    grads_file = g.get();
    grad_store = std::move(g);
  }
}

// --update-in-backward: each unit's part of this rank's range stepped as its backward ends
// (Note [Update in backward]): in one process from the store's buffers
// (optim/backward_update.h), at stages 2-3 once the per-unit reduction has reduce-scattered it
// (the ranks' norms gathered in rank order). Attached to the optimizer in create_optimizer.
void TrainRun::make_backward_update() {
  if (placement.grads_in_backward() && placement.grads_per_unit()) {
    rank_steps = std::make_unique<UnitSteps>(
        ParamLayout(mc), placement.owned_range(),
        [this](const UnitGradCheck& mine) {
          std::vector<UnitGradCheck> all(static_cast<size_t>(W));
          comm.all_gather(&mine, all.data(), std::vector<int64_t>(static_cast<size_t>(W), 1),
                          static_cast<int>(sizeof(UnitGradCheck)));
          return all;
        },
        W);
    fused = rank_steps.get();
  } else if (placement.grads_in_backward()) {
    auto u = std::make_unique<BackwardUpdate>(pool, ParamLayout(mc));
    fused = &u->steps();
    grad_store = std::move(u);
  }
}

// The model's state as the placement puts it, and the services that keep what the model does
// not hold (dist/zero/zero_state.h): stage 3's gathers (Note [ZeRO stage 3]) or the working
// weights' file; each micro-batch's gradients reduced unit by unit as the backward ends each
// (stages 2-3, 0-1 under --sync-every-micro-batch, and bf16 gradients at every stage: Notes
// [Sharded gradients], [Gradients in bf16]) or the gradients' file. `zero` keeps the concrete
// ones the loop uses besides: the sums over ranks, the offloaded working weights.
void TrainRun::make_model() {
  gpt.emplace(mc, pool, spec.precision,
              zero_model_state(placement, comm, param_file.get(), std::move(grad_store), &zero,
                               rank_steps.get()));
  if (gpt->precision().precision == Precision::fp16)
    scaler = std::make_unique<DynamicLossScaler>(settings.loss_scaler);
  // LoRA (Note [LoRA]): the adapters, drawn from the seed; the optimizer steps them alone.
  if (spec.lora.enabled()) gpt->add_lora(spec.lora, settings.seed);
}

void TrainRun::create_optimizer() {
  if (offload && spec.offload.disk_limit) check_disk_limit();
  if (offload)
    off = std::make_unique<offload::OffloadedOptimizer>(
        spec.optim, gpt->layout(), master, pool, offload_dir, offload_run,
        offload::kMaxPieceElements, my_shard);
  else
    opt = make_optimizer(spec.optim, gpt->lora() ? gpt->lora()->param_layout() : gpt->layout(),
                         &pool, my_shard);
  if (fused)
    fused->attach(spec.optim, *opt, gpt->weights(), gpt->weights_range().begin,
                  gpt->has_master() ? gpt->params() : Tensor{}, gpt->params_range().begin);
}

// --disk-limit against every offload file of this rank, before the optimizer's are made.
void TrainRun::check_disk_limit() const {
  const uint64_t need = offload::make_offload_layout(gpt->layout(), spec.optim, master,
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

// bf16 gradients: the update widens them a chunk at a time into one f32 buffer (Note
// [Gradients in bf16]; the planner counts it under staging). Then the set-up's ranges.
void TrainRun::make_grad_widen() {
  if (spec.grad_dtype == DType::bf16) {
    const Tensor widen =
        Tensor::empty(pool, {std::max<int64_t>(1, grad_widen_elements(spec.optim, gpt->layout()))},
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
  my_range = my_shard.value_or(whole_range(gpt->layout()));
  piece = setup_piece_elements(plan_step(gpt->config(), B, T, spec.activation_options()));
}

// The step's reservation, the profiler's view of the run, and the gradients' exchange.
void TrainRun::prepare_step() {
  gpt->reserve(B, T, spec.activation_options());
  if (profiler) {
    profiler->set_run(run_json(settings, placement), plan_memory(spec, comm.rank()));
    profiler->recorder()->set_plan(gpt->step_plan());
    gpt->set_step_observer(profiler->recorder());
    // The disk tier and the update's waits on it (Note [Memory profile], per rank, per tier).
    if (off) {
      profiler->set_disk(offload_files());
      off->record_waits(true);
      if (param_file) param_file->record_waits(true);
    }
  }
  // Data parallelism at stages 0-1: the whole slab's exchange and its receive ring
  // (Category::comm), for the run. Per-unit gradients (stages 2-3, above) reduce themselves,
  // through a receive ring of their own.
  if (W > 1 && !zero.grads)
    sync.emplace(comm, pool,
                 std::span<float>(gpt->grads().data<float>(), size_t(gpt->grads().numel())),
                 spec.bucket_bytes);
  // How the update sees the ranks: every stage adds the shards' sums of squares in rank order.
  if (W > 1) rank_shards = RankShards{&comm, placement.shards(), placement.grads_whole()};
}

// The training and validation loaders (none when the run has no step left), the training
// data's unigram entropy and tokenizer.
void TrainRun::open_data() {
  io::DataLoaderOptions dopt;
  dopt.batch_size = B;
  dopt.seq_len = T;
  dopt.shuffle = spec.shuffle;
  dopt.seed = settings.seed;
  dopt.vocab_size = mc.vocab_size;
  dopt.world = W;
  dopt.rank = comm.rank();
  dopt.vocab_source = settings.vocab_source;  // the preset's, or --vocab (train_spec.h)
  last_step = settings.stop_after ? std::min(spec.steps, settings.stop_after) : spec.steps;
  if (start_step < last_step) {
    train_data = std::make_unique<io::DataLoader>(io::DataLoader::train(pool, spec.data_dir, dopt));
    if (resume) check_resume_data(resumed, train_data->num_tokens(), spec.data_dir, state_file);
    train_data->set_position(data_position);
    if (!io::find_token_shards(spec.data_dir, "val").empty())
      val_data = std::make_unique<io::DataLoader>(io::DataLoader::val(pool, spec.data_dir, dopt));
    else if (lead && settings.eval_every > 0)
      fmt::print(stderr,
                 "memfit: no val_*.bin shards in {}: no validation loss (--eval-every {})\n",
                 spec.data_dir, settings.eval_every);
  }
  if (train_data) summary.unigram_entropy = unigram_entropy(*train_data, mc.vocab_size);
  // The tokenizer that `memfit prepare` recorded in the data's dataset.json (none for shards
  // from elsewhere); a malformed file is an error naming it.
  if (train_data)
    if (const auto info = io::read_dataset_info(spec.data_dir)) data_tokenizer = info->tokenizer;
}

// Rank 0's JSON-lines log, then what the saves need to know.
void TrainRun::open_log() {
  if (lead && !settings.log_file.empty()) {
    if (auto parent = fs::path(settings.log_file).parent_path(); !parent.empty()) {
      std::error_code ec;
      fs::create_directories(parent, ec);
      if (ec)
        MEMFIT_THROW(IoError, "train", "--log {}: cannot create {}: {}", settings.log_file,
                     parent.string(), ec.message());
    }
    // A resume continues the log from the checkpoint's step: the lines of steps after it (run
    // before a kill, and to be run again now) are cut first, so each step appears once.
    if (resume) truncate_log_after(settings.log_file, start_step);
    log.open(settings.log_file, resume ? std::ios::app : std::ios::trunc);
    if (!log) MEMFIT_THROW(IoError, "train", "--log {}: cannot open the file", settings.log_file);
  }
  // The weights of record, whole, for a save without ZeRO's shards (stage 0), where they are
  // one tensor in RAM. In one process with the weights of record on disk (the offloaded master
  // weights, or without master weights the offloaded working weights: save_streams_weights)
  // model.safetensors is streamed from the files instead (save; Note [Streamed save] in
  // docs/notes/checkpoints.md): nothing is read whole, and no other tensor is borrowed. From
  // stage 1 on no rank holds them whole: each writes its range into its shard file
  // (stage_shards), and the save has no model.safetensors (docs/notes/checkpoints.md, "ZeRO's
  // sharded optimizer state").
  streamed_save = save_streams_weights(spec);
  save_staging_n =
      save_staging_elements(spec, plan_step(gpt->config(), B, T, spec.activation_options()));
  // The weights of record's element type, as config.json names it for a sharded save.
  record_dtype = off && master            ? DType::f32
                 : gpt->params_offloaded() ? half_dtype(spec.precision.precision)
                                           : gpt->weights().dtype();
  sharded_state = placement.sharded_save();
  staging = settings.save_dir.empty() ? fs::path() : fs::path(settings.save_dir).concat(".zero-staging");
}

}  // namespace memfit
