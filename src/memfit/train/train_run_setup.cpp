// A run's set-up (train/train_run.h): the pool and the profiler, where this rank's state lives
// and the objects that hold it (the offload files, the model, the optimizer), the weights, the
// step's reservation, the gradients' exchange, the data and the log, in that order.
#include <unistd.h>

#include <algorithm>
#include <chrono>

#include <fmt/format.h>

#include "memfit/dist/gather_vectors.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/data/prepare.h"
#include "memfit/model/layout_map.h"
#include "memfit/model/stage_offsets.h"
#include "memfit/optim/apollo.h"
#include "memfit/optim/tensor_split.h"
#include "memfit/plan/interleaved_plan.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/state/shard.h"
#include "memfit/train/offload_disk.h"
#include "memfit/train/train_run.h"

namespace memfit {

namespace fs = std::filesystem;

namespace {

// The run of this rank's pipeline stage (RunSpec::stage; the whole run without --pp): from here
// on the model, its layout, the placement and the plan are the stage's.
TrainSpec stage_run(const TrainSpec& spec, const dist::ProcessGrid& grid) {
  MEMFIT_CHECK(spec.run.pp() == grid.shape().pipeline, "train",
               "the run was resolved for --pp {}, the grid has {} pipeline stages", spec.run.pp(),
               grid.shape().pipeline);
  TrainSpec s = spec;
  s.run = spec.run.stage(grid.coords().pipeline);
  return s;
}

// --update-in-backward under --pp: every stage's parts of the norm, in stage order (update.cpp's
// pipeline_check, for the fused steps' parts).
std::vector<UnitGradCheck> stage_checks(dist::Communicator& pipe,
                                        const std::vector<UnitGradCheck>& mine) {
  return dist::all_gather_vectors(pipe, mine);
}

}  // namespace

fs::path grid_offload_dir(fs::path dir, int stage, const dist::ProcessGrid& grid) {
  if (grid.shape().pipeline > 1) dir /= fmt::format("stage-{}", stage);
  if (grid.shape().tensor > 1) dir /= fmt::format("tensor-{}", grid.coords().tensor);
  return dir;
}

TrainRun::TrainRun(dist::ProcessGrid& grid_in, const TrainSpec& spec_in)
    : grid_(grid_in),
      comm_(grid_in.data()),
      tensor_(grid_in.tensor()),
      pipe_(grid_in.pipeline()),
      W_(comm_.size()),
      lead_(grid_in.world().rank() == 0),
      settings_(stage_run(spec_in, grid_in)),
      spec_(settings_.run),
      location_(settings_.checkpoint.location),
      resume_(settings_.checkpoint.resume),
      mc_(spec_.model),
      T_(spec_.T),
      B_(spec_.batch),
      run_threads_(spec_.threads),
      wall_start_(std::chrono::steady_clock::now()),
      pool_(spec_.mem_limit ? spec_.mem_limit : kUnlimited),
      pool_release_{(comm_.set_pool(&pool_), comm_), tensor_},
      // With several ranks the layout cut into one shard per rank where every optimizer state
      // allows (state/shard.h); from stage 1 on this rank's optimizer state and master weights
      // are its shard's alone (owned()), at stage 2 its gradients' sums too, at stage 3 its
      // working weights too. With one rank every stage is stage 0.
      placement_(ParamLayout(spec_.model), spec_.optim, spec_.state_options(), {comm_.rank(), W_}),
      my_shard_(placement_.owned()),
      // --offload-optimizer nvme: the optimizer state and the FP32 master weights live in files
      // and the update streams them (offload/offloaded_optimizer.h); the model keeps its working
      // weights. Under ZeRO (stages 1 to 3; RunSpec::check refuses stage 0) each rank offloads
      // its own shard, into its own subdirectory of --offload-dir, so ranks sharing one never
      // collide; the disk check and --disk-limit are per rank (Note [NVMe offload], "Under
      // ZeRO").
      offload_(placement_.optimizer_in_file()),
      master_(placement_.master().where != Residence::none),
      // --pp and --tp: the stages and the tensor ranks of one data rank hold other parts of
      // the state, so each offloads into a directory of its own under the data rank's (Note
      // [NVMe offload], "Under --tp", "Under --pp").
      // (Interleaved: chunk 0 is virtual stage s, the others' in make_chunks.)
      offload_dir_(grid_offload_dir(placement_.offload_dir(), grid_in.coords().pipeline,
                                    grid_in)) {
  start_profiler();
  if (location_.recovered) fmt::print(stderr, "memfit: {}\n", location_.note);
  make_state_files();
  make_backward_update();
  make_model();
  if (lead_) say_fp8_storage();
  create_optimizer();
  make_grad_widen();
  load_or_init();
  make_chunks();  // --pp-schedule interleaved: this rank's other chunks
  prepare_step();
  open_data();
  open_log();
}

// --profile: the pool's event log from here on, the step's phases and buffers over the first
// --profile-steps steps (profile/profiler.h). Each world rank writes its own directory
// (DIR/rank<q>): the tensor ranks and pipeline stages of a data rank hold other bytes.
void TrainRun::start_profiler() {
  if (!settings_.profile_dir.empty())
    profiler_ = std::make_unique<profile::Profiler>(
        profile::ProfileOptions{settings_.profile_dir, settings_.profile_steps,
                                grid_.world().rank(), grid_.world().size()},
        pool_, wall_start_);
}

// The offload directories and the files made before the model: --offload-params' working
// weights and --offload-grads' gradients.
void TrainRun::make_state_files() {
  // The directories made here (--offload-dir, a rank's subdirectory) go when the run ends, after
  // the files that the objects below remove as they are destroyed, or when it fails first (a
  // disk too small): no empty directory is left (io/created_directories.h).
  // (LoRA's frozen base may be the one file: Note [LoRA], "The frozen base on disk".)
  const bool files = offload_ || placement_.params_in_file();
  if (files) {
    // Over several ranks every rank adopts what was missing before any rank made it, so the
    // shared --offload-dir goes with whichever rank ends last, not only with the one that
    // happened to make it (io/created_directories.h, adopt).
    const std::vector<std::filesystem::path> missing = io::CreatedDirectories::missing(offload_dir_);
    // (Every rank of the world: under --tp the tensor ranks share the data rank's directory.)
    if (grid_.world().size() > 1) grid_.world().barrier();
    offload_dirs_.create(offload_dir_, "offload", "--offload-dir " + spec_.offload.dir);
    offload_dirs_.adopt(missing);
  }
  offload_run_ = fmt::format("memfit-{}-{}", ::getpid(),
                            std::chrono::system_clock::now().time_since_epoch().count());
  // --offload-params nvme: the blocks' working weights in a file beside the optimizer's (at
  // stage 3 this rank's shard of them), read through the model's ring (WeightGather's file
  // source; at stage 3 read, then all-gathered) and written back by the offloaded update
  // (LoRA's frozen base: read only, never written after the set-up).
  // Made before the model, so the model (whose ring the requests use) and its waits for them
  // go first (Note [NVMe offload], "Working weights on disk").
  // Every rank's offload files against the free bytes of the filesystem it shares with the
  // other ranks there, before any file is made (train/offload_disk.h).
  // (Interleaved: every chunk's files, checked together here before any is made.)
  if (files)
    check_offload_disk(grid_.world(), offload_dir_,
                       spec_.interleaved()
                           ? plan_interleaved_rank(spec_, pipe_.rank(), comm_.rank(), false)
                                 .disk_bytes
                           : plan_memory(spec_, comm_.rank()).disk_bytes);
  if (placement_.params_in_file())
    param_file_ = std::make_unique<offload::ParamFile>(
        ParamLayout(mc_), half_dtype(spec_.precision.precision), placement_.persist_threshold(),
        offload_dir_, offload_run_, placement_.params_file_range());
  // --offload-grads nvme (one process: RunSpec::check): the gradients per unit in a file,
  // written as each unit's backward ends and read by the update; no slab in RAM (Note [NVMe
  // offload], "Gradients on disk").
  if (placement_.grads_in_file()) {
    auto g = std::make_unique<offload::OffloadedGrads>(ParamLayout(mc_), pool_, offload_dir_,
                                                       offload_run_, spec_.grad_accum,
                                                       spec_.grad_dtype);
    grads_file_ = g.get();
    grad_store_ = std::move(g);
  }
}

// --update-in-backward: each unit's part of this rank's range stepped as its backward ends
// (Note [Update in backward]): in one process from the store's buffers
// (optim/backward_update.h), at stages 2-3 once the per-unit reduction has reduce-scattered it
// (the ranks' norms gathered in rank order). Attached to the optimizer in create_optimizer.
void TrainRun::make_backward_update() {
  if (placement_.grads_in_backward() && placement_.grads_per_unit()) {
    rank_steps_ = std::make_unique<UnitSteps>(
        ParamLayout(mc_), placement_.owned_range(),
        [this](const UnitGradCheck& mine) {
          std::vector<UnitGradCheck> all(static_cast<size_t>(W_));
          comm_.all_gather(&mine, all.data(), std::vector<int64_t>(static_cast<size_t>(W_), 1),
                          static_cast<int>(sizeof(UnitGradCheck)));
          return all;
        },
        W_);
    fused_ = rank_steps_.get();
  } else if (placement_.grads_in_backward()) {
    auto u = std::make_unique<BackwardUpdate>(pool_, ParamLayout(mc_));
    fused_ = &u->steps();
    grad_store_ = std::move(u);
  }
}

// The model's state as the placement puts it, and the services that keep what the model does
// not hold (dist/zero/zero_state.h): stage 3's gathers (Note [ZeRO stage 3]) or the working
// weights' file; each micro-batch's gradients reduced unit by unit as the backward ends each
// (stages 2-3, 0-1 under --sync-every-micro-batch, and bf16 gradients at every stage: Notes
// [Sharded gradients], [Gradients in bf16]) or the gradients' file. `zero` keeps the concrete
// ones the loop uses besides: the sums over ranks, the offloaded working weights.
void TrainRun::make_model() {
  ModelState state = zero_model_state(placement_, comm_, param_file_.get(),
                                      std::move(grad_store_), &zero_, rank_steps_.get());
  // A quantized base (Note [NF4 weights], "QLoRA"; Note [Int8 weights]): the blocks' linears
  // as NF4 or int8, quantized at load.
  state.base_quant = spec_.lora.base_quant();  // RunSpec::check_base_dtype: only with LoRA
  gpt_.emplace(mc_, pool_, spec_.precision, std::move(state));
  if (mc_.tp > 1) {  // before the weights are drawn
    tensor_.lend_buffers(pool_, spec_.sp, int64_t{B_} * T_ * mc_.d_model);
    // --tp-overlap: the column-parallel sums on the group's communication thread (no buffer of
    // its own: they use the group's, which nothing else touches meanwhile).
    if (spec_.tp_overlap) tensor_.start_overlap();
    gpt_->set_tensor_group(tensor_);
  }
  // --update-in-backward under --tp: each unit's partial sums over the tensor group before its
  // step, and the norm over the group (Note [Update in backward], "Under --tp").
  if (fused_ && mc_.tp > 1) split_unit_steps(*gpt_, *fused_, spec_.optim.name);
  // Under --pp: the norm over the stages, once the pass through every stage is done (Note
  // [Update in backward], "Under --pp").
  if (fused_ && pipe_.size() > 1)
    fused_->set_pipeline([this](const std::vector<UnitGradCheck>& mine) {
      return stage_checks(pipe_, mine);
    });
  if (gpt_->precision().precision == Precision::fp16)
    scaler_ = std::make_unique<DynamicLossScaler>(settings_.loss_scaler);
  // LoRA (Note [LoRA]): the adapters, drawn from the seed; the optimizer steps them alone.
  if (spec_.lora.enabled()) gpt_->add_lora(spec_.lora, settings_.seed);
}

// --precision fp8 (Note [FP8], "Storage"): where this run keeps the blocks' linear weights, and
// why where it keeps bf16 (the placement is every rank's alike).
void TrainRun::say_fp8_storage() const {
  if (spec_.precision.precision != Precision::fp8) return;
  if (!placement_.params_fp8()) {
    fmt::print(stderr,
               "memfit: --precision fp8: the blocks' linear weights are stored as bf16 and cast "
               "to E4M3 at each use (the same values as the stored codes): {}\n",
               placement_.fp8_fallback());
    return;
  }
  std::string where;
  if (mc_.pipelined()) where += ", each pipeline stage its own matrices";
  if (mc_.tp > 1)
    where += fmt::format(", each of the --tp {} ranks its slice of every matrix with the whole "
                         "matrix's scale (the tensor group agrees on it)",
                         mc_.tp);
  if (placement_.owned())
    where += fmt::format("; ZeRO stage {} over {} ranks: each rank encodes its shard with the "
                         "scales the ranks agree on, and the codes are all-gathered",
                         placement_.stage(), W_);
  fmt::print(stderr,
             "memfit: --precision fp8: the blocks' linear weights are stored as E4M3 codes, one "
             "byte each, with a scale per matrix{}\n",
             where);
}

void TrainRun::create_optimizer() {
  if ((offload_ || param_file_) && spec_.offload.disk_limit) check_disk_limit();
  make_optimizer_for(*gpt_, spec_.optim, offload_ ? offload_dir_ : std::filesystem::path(),
                     my_shard_, opt_, off_);
  if (fused_ && off_) {
    // --update-in-backward with the state on disk: each unit's state read, stepped and written
    // back as its backward ends (Note [Update in backward], "With offload"); the working weights
    // in RAM, or with --offload-params in the slots the backward read them into.
    // Over ranks (stages 2-3) this rank's range: stage 2's part of the whole working copy,
    // stage 3's shard itself.
    if (gpt_->params_offloaded())
      off_->attach_backward(*zero_.weights);
    else if (my_shard_ && !gpt_->params_sharded())
      off_->attach_backward(gpt_->params().view(my_shard_->begin, {my_shard_->size()}));
    else
      off_->attach_backward(gpt_->params());
    fused_->attach(*off_);
  } else if (fused_) {
    // Stored FP8 weights (Note [FP8], "Storage"): each stepped unit's working copy rounded and
    // encoded from its master weights at once, not in the optimizer's pass; from a shard of
    // them (stage 2) after the backward, by the publish, with the scales the ranks agree on.
    const bool slab = gpt_->has_master() && !gpt_->fp8_weights();
    fused_->attach(spec_.optim, *opt_, gpt_->weights(), gpt_->weights_range().begin,
                  slab ? gpt_->params() : Tensor{}, gpt_->params_range().begin);
    if (gpt_->fp8_weights() && gpt_->whole_weights())
      fused_->set_stepped_hook([this](ElementRange part) { gpt_->refresh_working(part); });
  }
}

// `gpt`'s optimizer over `shard` of its state (none: the whole): in RAM (`opt`), or with a
// `dir` streamed from its files there (`off`); the run's (create_optimizer) and each
// interleaved chunk's (make_chunk_optimizer) alike. Offloaded, each piece's optimizer takes the
// tensor split (its pieces are stepped in the same order on every rank of the group).
void TrainRun::make_optimizer_for(Transformer& gpt, const OptimConfig& optim,
                                  const std::filesystem::path& dir,
                                  std::optional<ElementRange> shard,
                                  std::unique_ptr<Optimizer>& opt,
                                  std::unique_ptr<offload::OffloadedOptimizer>& off) {
  if (dir.empty()) {
    opt = make_optimizer(optim, gpt.lora() ? gpt.lora()->param_layout() : gpt.layout(), &pool_,
                         shard);
    place_optimizer(*opt, gpt);
    return;
  }
  off = std::make_unique<offload::OffloadedOptimizer>(optim, gpt.layout(), master_, pool_, dir,
                                                      offload_run_, offload::kMaxPieceElements,
                                                      shard);
  const ModelConfig& c = gpt.config();
  if (c.tp > 1 && !gpt.lora() && takes_tensor_split(optim.name))
    off->set_tensor_split({gpt.tensor_group(), slice_axes(c)});
}

// What an optimizer over `gpt`'s layout needs of where that layout lies (the run's model, or
// under --pp-schedule interleaved each chunk's, make_chunks). --tp: Adam-mini's row-parallel
// rows and 4-bit AdamW's rank-1 maxima taken over the tensor group in the update
// (optim/tensor_split.h); the other optimizers need nothing. --pp: APOLLO draws each matrix's
// projection by its index in the whole model, from the stage's (or chunk's) first parameter:
// a rank's chunks are not contiguous in the model, so each has its own base.
void TrainRun::place_optimizer(Optimizer& opt, Transformer& gpt) {
  const ModelConfig& c = gpt.config();
  if (c.tp > 1 && !gpt.lora() && takes_tensor_split(spec_.optim.name))
    set_tensor_split(opt, {gpt.tensor_group(), slice_axes(c)});
  if (auto* apollo = dynamic_cast<Apollo*>(&opt); apollo && c.pipelined())
    apollo->set_param_index_base(first_param_index(c));
}

// --disk-limit against every offload file of this rank, before the optimizer's are made
// (interleaved: every chunk's, as planned, before the other chunks' are made).
void TrainRun::check_disk_limit() const {
  const uint64_t need =
      spec_.interleaved() ? plan_interleaved_rank(spec_, pipe_.rank(), comm_.rank(), false).disk_bytes
                          : (offload_ ? offload::make_offload_layout(gpt_->layout(), spec_.optim,
                                                                 master_,
                                                                 offload::kMaxPieceElements,
                                                                 my_shard_)
                                         .disk_total()
                                   : 0) +
                        (param_file_ ? param_file_->layout().file_bytes : 0) +
                        (grads_file_ ? grads_file_->file_layout().file_bytes : 0);
  if (need > spec_.offload.disk_limit)
    MEMFIT_THROW(ConfigError, "config",
                 "--disk-limit {} bytes ({:.2f} GiB): the offload files need {} bytes ({:.2f} "
                 "GiB){}",
                 spec_.offload.disk_limit, spec_.offload.disk_limit / 1073741824.0, need,
                 need / 1073741824.0,
                 W_ > 1 ? fmt::format(" on rank {} (the limit is per rank)", comm_.rank()) : "");
}

// bf16 gradients: the update widens them a chunk at a time into one f32 buffer (Note
// [Gradients in bf16]; the planner counts it under staging). Then the set-up's ranges.
void TrainRun::make_grad_widen() {
  if (spec_.grad_dtype == DType::bf16) {
    // (--pp-schedule interleaved: one for every chunk's optimizer, the largest chunk's.)
    grad_widen_ = Tensor::empty(pool_, {std::max<int64_t>(1, chunks_widen_elements())},
                                DType::f32, Category::staging, "grads.widen");
    if (off_) off_->set_grad_widen(grad_widen_);
    else opt_->set_grad_widen(grad_widen_);
  }
  // The set-up fills the weights of record and the working copy by range (Note [Set-up by
  // range] in docs/notes/zero.md): this rank's range of the initial weights drawn, or of each
  // tensor read from the checkpoint, straight into the f32 weights of record (the master
  // weights, or f32 working weights; offloaded master weights a unit at a time into their
  // file's I/O buffer), the rest of the working copy (stages 1-2: the other ranks' parts; bf16
  // weights of record) through one staging piece no larger than the step's activation arena,
  // so the set-up never holds more than the step (setup_piece_elements).
  my_range_ = my_shard_.value_or(whole_range(gpt_->layout()));
  piece_ = setup_piece_elements(plan_step(gpt_->config(), B_, T_, spec_.activation_options()));
}

// The step's reservation, the profiler's view of the run, and the gradients' exchange.
void TrainRun::prepare_step() {
  gpt_->reserve(B_, T_, spec_.activation_options());
  if (profiler_) {
    nlohmann::json run = run_json(settings_, placement_);
    if (grid_.world().size() != W_) {  // --tp, --pp: where this rank sits in the grid
      run["world_rank"] = grid_.world().rank();
      run["tensor_rank"] = grid_.tensor().rank();
      run["stage"] = pipe_.rank();
    }
    profiler_->set_run(std::move(run), plan_memory(spec_, comm_.rank()));
    profiler_->recorder()->set_plan(gpt_->step_plan());
    gpt_->set_step_observer(profiler_->recorder());
    // The disk tier and the update's waits on it (Note [Memory profile], per rank, per tier).
    if (off_ || param_file_) {
      profiler_->set_disk(offload_files());
      if (off_) off_->record_waits(true);
      if (param_file_) param_file_->record_waits(true);
    }
  }
  // Data parallelism at stages 0-1: the whole slab's exchange and its receive ring
  // (Category::comm), for the run. Per-unit gradients (stages 2-3, above) reduce themselves,
  // through a receive ring of their own.
  // LoRA (Note [LoRA], "Over data-parallel ranks"): the adapters' gradients are the slab
  // summed, like any gradients; the frozen base has none.
  if (W_ > 1 && !zero_.grads) {
    Tensor& g = gpt_->lora() ? gpt_->lora_grads() : gpt_->grads();
    sync_.emplace(comm_, pool_, std::span<float>(g.data<float>(), size_t(g.numel())),
                 spec_.bucket_bytes);
  }
  // How the update sees the ranks: every stage adds the shards' sums of squares in rank order.
  if (W_ > 1) rank_shards_ = RankShards{&comm_, placement_.shards(), placement_.grads_whole()};
  // --pp (Note [Pipeline parallel]): the runner's kept inputs and transfer buffers, for the run
  // (the planner's pipeline_buffers); the pipeline group is the ranks of this tensor index, one
  // a stage, so each tensor rank sends its copy (--sp: its rows) to its peer of the next stage.
  if (spec_.pp() > 1)
    runner_ = std::make_unique<dist::PipelineRunner>(
        pipe_, spec_.pipe_schedule, spec_.grad_accum,
        dist::pipeline_boundary_floats(mc_, spec_.activation_options(), B_, T_), pool_,
        spec_.pipe_virtual);
  prepare_chunks();
  // A tied model's first and last stages: the table's receive buffer (Note [Pipeline
  // parallel], "Tied embeddings"; the planner's tied_gradient_buffer_bytes).
  // At ZeRO 2-3 each data rank holds its shard of its stage's sums, and the two stages'
  // layouts are cut differently: each rank exchanges the part of the table it owns with the
  // other stage's data ranks that own it there (dist::tied_shard_pieces, over the world).
  // (LoRA's frozen base has no table gradient: no sum, no buffer.)
  // (Interleaved: the first virtual stage's chunk on rank 0, the last's on rank P - 1.)
  if (const ElementRange table = tied_table(tied_model().config(), tied_model().layout());
      !table.empty() && !gpt_->lora()) {
    const StatePlacement& placed = tied_placement();
    const bool head = tied_model().config().stage.has_head();
    if (W_ > 1 && !placed.grads_whole()) {
      const int S = static_cast<int>(spec_.pipeline.size());  // stages (interleaved: P x V)
      const ModelConfig first_model = spec_.stage(0).model;
      const ParamLayout first(first_model), last(spec_.stage(S - 1).model);
      const std::vector<ElementRange> first_shards = shard_ranges(first, spec_.optim, W_),
                                      last_shards = shard_ranges(last, spec_.optim, W_);
      MEMFIT_CHECK(placed.shards() == (head ? last_shards : first_shards),
                   "pipeline", "the tied table's shards are not this stage's placement's");
      tied_.emplace(grid_.world(),
                    dist::tied_shard_pieces(first_shards, last_shards, tied_table(first_model, first),
                                            tied_table_copy(last), grid_.shape(), grid_.coords(),
                                            placed.my_shard().begin),
                    table.size(), !head, pool_);
    } else {
      tied_.emplace(pipe_, table, pool_);
    }
  }
}

// The training and validation loaders (none when the run has no step left), the training
// data's unigram entropy and tokenizer.
void TrainRun::open_data() {
  io::DataLoaderOptions dopt;
  dopt.batch_size = B_;
  dopt.seq_len = T_;
  dopt.shuffle = spec_.shuffle;
  dopt.seed = settings_.seed;
  dopt.vocab_size = mc_.vocab_size;
  dopt.world = W_;
  dopt.rank = comm_.rank();
  dopt.vocab_source = settings_.vocab_source;  // the preset's, or --vocab (train_spec.h)
  last_step_ = settings_.stop_after ? std::min(spec_.steps, settings_.stop_after) : spec_.steps;
  if (start_step_ < last_step_) {
    train_data_ =
        std::make_unique<io::DataLoader>(io::DataLoader::train(pool_, spec_.data_dir, dopt));
    if (resume_)
      check_resume_data(resumed_, train_data_->num_tokens(), spec_.data_dir, state_file_);
    train_data_->set_position(data_position_);
    if (!io::find_token_shards(spec_.data_dir, "val").empty())
      val_data_ =
          std::make_unique<io::DataLoader>(io::DataLoader::val(pool_, spec_.data_dir, dopt));
    else if (lead_ && settings_.eval_every > 0)
      fmt::print(stderr,
                 "memfit: no val_*.bin shards in {}: no validation loss (--eval-every {})\n",
                 spec_.data_dir, settings_.eval_every);
  }
  if (train_data_) summary_.unigram_entropy = unigram_entropy(*train_data_, mc_.vocab_size);
  // The tokenizer that `memfit prepare` recorded in the data's dataset.json (none for shards
  // from elsewhere); a malformed file is an error naming it.
  if (train_data_)
    if (const auto info = io::read_dataset_info(spec_.data_dir)) data_tokenizer_ = info->tokenizer;
}

// Rank 0's JSON-lines log, then what the saves need to know.
void TrainRun::open_log() {
  if (lead_ && !settings_.log_file.empty()) {
    if (auto parent = fs::path(settings_.log_file).parent_path(); !parent.empty()) {
      std::error_code ec;
      fs::create_directories(parent, ec);
      if (ec)
        MEMFIT_THROW(IoError, "train", "--log {}: cannot create {}: {}", settings_.log_file,
                     parent.string(), ec.message());
    }
    // A resume continues the log from the checkpoint's step: the lines of steps after it (run
    // before a kill, and to be run again now) are cut first, so each step appears once.
    if (resume_) truncate_log_after(settings_.log_file, start_step_);
    log_.open(settings_.log_file, resume_ ? std::ios::app : std::ios::trunc);
    if (!log_) MEMFIT_THROW(IoError, "train", "--log {}: cannot open the file", settings_.log_file);
  }
  // The weights of record, whole, for a save without ZeRO's shards (stage 0), where they are
  // one tensor in RAM. In one process with the weights of record on disk (the offloaded master
  // weights, or without master weights the offloaded working weights: save_streams_weights)
  // model.safetensors is streamed from the files instead (save; Note [Streamed save] in
  // docs/notes/checkpoints.md): nothing is read whole, and no other tensor is borrowed. From
  // stage 1 on no rank holds them whole: each writes its range into its shard file
  // (stage_shards), and the save has no model.safetensors (docs/notes/checkpoints.md, "ZeRO's
  // sharded optimizer state").
  streamed_save_ = save_streams_weights(spec_);
  const StepPlan save_plan = plan_step(gpt_->config(), B_, T_, spec_.activation_options());
  save_staging_n_ = save_staging_elements(spec_, save_plan);
  save_quant_n_ = save_quant_staging_elements(spec_, save_plan);
  // The weights of record's element type, as config.json names it for a sharded save.
  record_dtype_ = off_ && master_            ? DType::f32
                 : gpt_->params_offloaded() ? half_dtype(spec_.precision.precision)
                                           : gpt_->weights().dtype();
  sharded_state_ = placement_.sharded_save();
  // LoRA at stage 3: no rank holds the frozen base whole, so each writes its shard of it into
  // its shard file (no optimizer state: the adapters' is adapter_optimizer.safetensors).
  if (gpt_->lora() && gpt_->params_sharded()) {
    OptimConfig none;
    none.name = "sgd";
    base_record_ = make_optimizer(none, gpt_->layout(), nullptr, gpt_->params_range());
    sharded_state_ = true;
  }
  // A split layout saves whole tensors, every rank its runs (stage_layout_files), whatever the
  // ZeRO stage on the data group: no shard files.
  layout_save_ = layout_split(mc_);
  if (layout_save_) sharded_state_ = false;
  staging_ = settings_.save_dir.empty() ? fs::path()
                                        : fs::path(settings_.save_dir).concat(".zero-staging");
}

}  // namespace memfit
