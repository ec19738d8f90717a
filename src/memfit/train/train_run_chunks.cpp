// --pp-schedule interleaved (Note [Pipeline parallel], "Interleaved"): a rank of V chunks. The
// rank's chunk c is virtual stage c x P + stage of the P x V (RunSpec::stage), a model of its
// own: chunk 0 is the run's model (gpt_, opt_, sync_), chunks 1 .. V - 1 are chunks_, each with
// its placement, optimizer and data group's exchange. Every chunk is a pipeline stage's model as
// 1F1B's are, so its parameters are one run of the whole layout drawn at its offsets; the
// schedule (dist/pipeline_runner.h, run_chunks) runs each chunk's micro-batches in order, so
// every gradient is one process's sum; the gradient norm adds each chunk's parts gathered over
// the pipeline group in virtual-stage order (train/update.h, apply_update_chunks).
#include <fmt/format.h>

#include "memfit/model/stage_offsets.h"
#include "memfit/offload/offload_layout.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/train/train_run.h"

namespace memfit {

Transformer& TrainRun::chunk_model(int c) {
  return c == 0 ? *gpt_ : *chunks_.at(static_cast<size_t>(c - 1))->gpt;
}

std::optional<dist::GradientSync>& TrainRun::chunk_sync(int c) {
  return c == 0 ? sync_ : chunks_.at(static_cast<size_t>(c - 1))->sync;
}

// Chunks 1 .. V - 1: each virtual stage's model, placed over the data group as chunk 0 is (any
// ZeRO stage), its offload files (make_chunk_files), its optimizer, and its initial weights
// (the whole model's draw at its offsets) or its runs of the checkpoint's tensors (and
// optimizer state).
void TrainRun::make_chunks() {
  const int V = settings_.run.pipe_virtual, P = spec_.pp();
  if (V <= 1) return;
  for (int c = 1; c < V; ++c) {
    auto k = std::make_unique<Chunk>();
    k->run = spec_.stage(c * P + pipe_.rank());  // spec_ keeps the whole cut of P x V chunks
    k->placement.emplace(ParamLayout(k->run.model), k->run.optim, k->run.state_options(),
                         RankCoords{comm_.rank(), W_});
    make_chunk_files(*k, c * P + pipe_.rank());
    ModelState state =
        zero_model_state(*k->placement, comm_, k->param_file.get(), nullptr, &k->zero, nullptr);
    k->gpt.emplace(k->run.model, pool_, k->run.precision, std::move(state));
    // --tp: the tensor group and its buffers, lent once (make_model), before the weights.
    if (mc_.tp > 1) k->gpt->set_tensor_group(tensor_);
    // LoRA: the chunk's blocks' adapters, drawn from the whole model's (as the run's, make_model);
    // its optimizer steps them alone.
    if (spec_.lora.enabled()) k->gpt->add_lora(spec_.lora, settings_.seed);
    make_chunk_optimizer(*k);
    if (location_.dir.empty()) {
      Transformer::MasterSink to_master_file;  // offloaded master weights: into their file
      if (k->off && master_)
        to_master_file = [&](const Transformer::RangeFill& fill) {
          k->off->write_master_from(fill);
        };
      k->gpt->init_weights(settings_.seed, piece_, to_master_file);
    } else {
      load_chunk_by_layout(*k);  // train_run_layout.cpp
    }
    chunks_.push_back(std::move(k));
  }
}

// Offloaded (Note [NVMe offload], "Under --pp"): the chunk's directory, stage-<virtual stage>/
// under the data rank's (then tensor-<t>/), made as make_state_files makes chunk 0's (every
// rank of the world adopts what was missing before any made it); its working weights' file.
// The disk was checked for every chunk's files with chunk 0's (make_state_files).
void TrainRun::make_chunk_files(Chunk& k, int virtual_stage) {
  const StatePlacement& p = *k.placement;
  if (!p.optimizer_in_file() && !p.params_in_file()) return;
  k.offload_dir = grid_offload_dir(p.offload_dir(), virtual_stage, grid_);
  const std::vector<std::filesystem::path> missing =
      io::CreatedDirectories::missing(k.offload_dir);
  if (grid_.world().size() > 1) grid_.world().barrier();
  k.offload_dirs.create(k.offload_dir, "offload", "--offload-dir " + spec_.offload.dir);
  k.offload_dirs.adopt(missing);
  if (p.params_in_file())
    k.param_file = std::make_unique<offload::ParamFile>(
        ParamLayout(k.run.model), half_dtype(k.run.precision.precision), p.persist_threshold(),
        k.offload_dir, offload_run_, p.params_file_range());
}

// The chunk's optimizer (make_optimizer_for: in RAM, or streamed from its files); bf16
// gradients widened through the run's one buffer.
void TrainRun::make_chunk_optimizer(Chunk& k) {
  make_optimizer_for(*k.gpt, k.run.optim,
                     k.placement->optimizer_in_file() ? k.offload_dir : std::filesystem::path(),
                     k.placement->owned(), k.opt, k.off);
  if (spec_.grad_dtype != DType::bf16) return;
  if (k.off)
    k.off->set_grad_widen(grad_widen_);
  else
    k.opt->set_grad_widen(grad_widen_);
}

// bf16 gradients: the widening buffer's elements, the most any of this rank's chunks needs (the
// planner's, plan_interleaved_rank).
int64_t TrainRun::chunks_widen_elements() const {
  int64_t most = grad_widen_elements(spec_.optim, gpt_->layout());
  const int P = spec_.pp();
  for (int c = 1; c < spec_.pipe_virtual; ++c)
    most = std::max(most, grad_widen_elements(spec_.optim,
                                              ParamLayout(spec_.stage(c * P + pipe_.rank()).model)));
  return most;
}

// Each chunk's step reservation and exchange (chunk 0's are prepare_step's).
void TrainRun::prepare_chunks() {
  for (auto& k : chunks_) {
    k->gpt->reserve(B_, T_, k->run.activation_options());
    if (W_ > 1 && !k->zero.grads) {  // the slab's exchange, as chunk 0's (prepare_step)
      Tensor& g = k->gpt->lora() ? k->gpt->lora_grads() : k->gpt->grads();
      k->sync.emplace(comm_, pool_, std::span<float>(g.data<float>(), size_t(g.numel())),
                      spec_.bucket_bytes);
    }
    if (W_ > 1) k->shards = RankShards{&comm_, k->placement->shards(), k->placement->grads_whole()};
  }
}

// The model of this rank that holds a tied table (the first virtual stage's, on rank 0) or its
// copy (the last's, on rank P - 1); the run's model where none does (or one chunk a rank).
Transformer& TrainRun::tied_model() {
  for (auto& k : chunks_)
    if (!tied_table(k->gpt->config(), k->gpt->layout()).empty()) return *k->gpt;
  return *gpt_;
}

// tied_model()'s placement over the data group.
const StatePlacement& TrainRun::tied_placement() const {
  for (const auto& k : chunks_)
    if (!tied_table(k->gpt->config(), k->gpt->layout()).empty()) return *k->placement;
  return placement_;
}

// The step's chunk forwards and backwards in Megatron's interleaved order (run_chunks). A chunk
// before the last virtual stage runs each forward to send its output on and again before its
// backward from the kept input; the last virtual stage's forward (the loss) runs with its
// backward. Every chunk's last backward (micro-batch m - 1) finishes its gradients for its data
// group's exchange. Returns the losses' sum in micro-batch order on the rank of the last virtual
// stage, 0 elsewhere.
double TrainRun::chunk_micro_batches(const StepLoss& step_loss) {
  const int M = spec_.grad_accum, V = runner_->virtual_stages(), P = spec_.pp();
  const float loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  const int64_t first = train_data_->position();
  auto load = [&](int m) {
    const profile::Scope data(recorder(), "data", profile::SliceKind::data);
    train_data_->set_position(first + m);
    train_data_->next_batch();
  };
  auto is_last = [&](int c) { return c * P + pipe_.rank() + 1 == P * V; };
  std::vector<float> losses(static_cast<size_t>(M), 0.0f);
  runner_->run_chunks(
      {[&](int c, int m, std::span<const float> in, std::span<float> out) {
         if (is_last(c)) return;  // its forward runs with the backward
         const profile::Scope batch(recorder(),
                                    fmt::format("chunk {} micro-batch {} forward", c, m + 1),
                                    profile::SliceKind::micro_batch);
         load(m);
         Transformer& gpt = chunk_model(c);
         gpt.set_stage_io({in.data(), out.data(), nullptr, nullptr});
         micro_batch_loss(gpt, *train_data_, step_loss, /*training=*/false);
       },
       [&](int c, int m, std::span<const float> in, std::span<const float> dout,
           std::span<float> din) {
         const profile::Scope batch(recorder(), fmt::format("chunk {} micro-batch {}", c, m + 1),
                                    profile::SliceKind::micro_batch);
         load(m);
         Transformer& gpt = chunk_model(c);
         gpt.set_stage_io({in.data(), nullptr, dout.data(), din.data()});
         const float loss =
             micro_batch_loss(gpt, *train_data_, step_loss, /*training=*/true, loss_scale);
         if (is_last(c)) losses[static_cast<size_t>(m)] = loss;
         std::optional<dist::GradientSync>& sync = chunk_sync(c);
         // (LoRA: the adapters' buckets all start in finish(), as in micro_batches.)
         if (sync && !gpt.lora() && m + 1 == M)
           gpt.backward([&](int64_t from) { sync->final_from(from); });
         else
           gpt.backward();
       }});
  for (int c = 0; c < V; ++c) chunk_model(c).set_stage_io({});
  train_data_->set_position(settings_.repeat_batch ? data_position_ : first + M);
  double loss_sum = 0;
  for (float l : losses) loss_sum += l;
  return loss_sum;
}

// The update over every chunk: one gradient norm from the virtual stages' parts in order, each
// chunk's optimizer (in RAM, or streamed from its files) stepped by the same factor.
UpdateOutcome TrainRun::chunk_update(float lr) {
  std::vector<ChunkUpdate> parts;
  auto add = [&](Transformer& gpt, Optimizer* opt, offload::OffloadedOptimizer* off,
                 ZeroServices& zero, const StatePlacement& placement, const RankShards* shards) {
    ChunkUpdate u{&gpt, opt, shards, {}};
    if (off)
      u.step = [&gpt, off, &zero, &placement, shards, this](float rate, float scale) {
        return offloaded_chunk_step(gpt, *off, zero, placement, shards, rate, scale);
      };
    parts.push_back(std::move(u));
  };
  add(*gpt_, opt_.get(), off_.get(), zero_, placement_, rank_shards_ ? &*rank_shards_ : nullptr);
  for (auto& k : chunks_)
    add(*k->gpt, k->opt.get(), k->off.get(), k->zero, *k->placement,
        k->shards ? &*k->shards : nullptr);
  const UpdateOutcome out =
      apply_update_chunks(parts, scaler_.get(), lr, spec_.clip, spec_.grad_accum * W_, pipe_);
  if (off_) offload_io_waits();  // chunk 0's, under --profile
  params_io_waits();
  return out;
}

// One chunk's offloaded step (offloaded_step's, without --offload-grads: RunSpec::check_pipeline)
// over its range of the working weights and gradients, then the working weights published as
// the in-RAM update does; returns the bytes that all-gather covered.
int64_t TrainRun::offloaded_chunk_step(Transformer& gpt, offload::OffloadedOptimizer& off,
                                       ZeroServices& zero, const StatePlacement& placement,
                                       const RankShards* shards, float rate, float scale) {
  const std::optional<ElementRange> owned = placement.owned();
  const ElementRange range = owned.value_or(whole_range(gpt.layout()));
  if (gpt.params_offloaded()) {
    off.step(*zero.weights, gpt.grad_sums(range), rate, scale);
  } else {
    Tensor working = gpt.params_sharded() ? gpt.params()
                                          : gpt.params().view(range.begin, {range.size()});
    off.step(working, gpt.grad_sums(range), rate, scale);
  }
  return publish_working_weights(gpt, owned ? shards : nullptr);
}

// The evaluation's forwards through the virtual stages (run_chunk_forwards); the sum of the
// losses on the rank of the last virtual stage, 0 elsewhere.
double TrainRun::chunk_evaluate(const StepLoss& eval_loss, int64_t n) {
  double sum = 0;
  const int V = runner_->virtual_stages(), P = spec_.pp();
  runner_->run_chunk_forwards(
      static_cast<int>(n), [&](int c, int i, std::span<const float> in, std::span<float> out) {
        const profile::Scope slice(recorder(),
                                   fmt::format("evaluation batch {} chunk {}", i + 1, c),
                                   profile::SliceKind::micro_batch);
        {
          const profile::Scope data(recorder(), "data", profile::SliceKind::data);
          val_data_->set_position(i);
          val_data_->next_batch();
        }
        Transformer& gpt = chunk_model(c);
        gpt.set_stage_io({in.data(), out.data(), nullptr, nullptr});
        const float loss = micro_batch_loss(gpt, *val_data_, eval_loss, /*training=*/false);
        if (c * P + pipe_.rank() + 1 == P * V) sum += loss;
      });
  for (int c = 0; c < V; ++c) chunk_model(c).set_stage_io({});
  return sum;
}

}  // namespace memfit
