// A run's step (train/train_run.h): the micro-batches' forward and backward with gradient
// accumulation, the sums over the ranks, the update (in RAM, or streamed from the offload
// files), the check that nothing became non-finite; and the evaluation.
#include <cmath>
#include <csignal>

#include <fmt/format.h>

#include "memfit/model/lora_dropout.h"
#include "memfit/train/train_run.h"

namespace memfit {

Tensor TrainRun::my_part(Tensor& slab) const {
  return slab.view(my_range_.begin, {my_range_.size()});
}

// The sum over ranks of a float (the loss, the stop flag, evaluation), through whichever
// exchange the run has.
float TrainRun::sum_ranks(float x) { return sync_ ? sync_->sum(x) : zero_.grads->sum(x); }

TrainRun::StepResult TrainRun::step(int64_t step, std::chrono::steady_clock::time_point t0) {
  StepResult r;
  gpt_->zero_grad();
  for (auto& k : chunks_) k->gpt->zero_grad();
  // A step skipped for an fp16 overflow does not advance the schedule (loss_scaler.h): its
  // position is the number of steps that updated, which the scaler's state keeps over resumes.
  // (Only the update changes that count, so the rate is known before the micro-batches.)
  r.lr = settings_.schedule.at(step - (scaler_ ? scaler_->skipped() : 0));
  if (fused_)  // --update-in-backward steps with it during the backward
    fused_->begin_step(r.lr, spec_.clip, spec_.clip_mode);
  r.before = io_mark();
  const dist::CommunicatorTensorGroup::Volume tensor_before = tensor_.volume();
  // fp16: the last backward unscales each offloaded unit as the update in RAM unscales the
  // slab, by the same scale.
  if (grads_file_)
    grads_file_->set_unscale(scaler_ ? std::optional<float>(scaler_->inv_scale()) : std::nullopt);
  r.loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  const StepLoss step_loss =  // masks: the step's masked-in targets (masked_loss.h)
      step_loss_begin(*train_data_, spec_.grad_accum, int64_t{spec_.grad_accum} * W_, r.loss_scale);
  double loss_sum = !runner_                      ? micro_batches(step, step_loss)
                    : runner_->virtual_stages() > 1 ? chunk_micro_batches(step_loss)
                                                    : pipeline_micro_batches(step_loss);
  loss_sum = from_last_stage(loss_sum);  // --pp: the last stage's losses, on every stage
  if (W_ > 1) {
    // The buckets the backward did not finish in time, then the loss over every rank.
    const profile::Scope all(recorder(), "gradient all-reduce", profile::SliceKind::collective);
    if (sync_) sync_->finish();
    for (auto& k : chunks_)
      if (k->sync) k->sync->finish();
    loss_sum = sum_ranks(static_cast<float>(loss_sum));
  }
  if (tied_) {
    // --pp, tied embeddings: the embedding's and the head's parts of the table's gradient
    // (each summed over the data group already), added on the first and last stages.
    const profile::Scope tied(recorder(), "tied gradient sum", profile::SliceKind::collective);
    // (The summed gradients: the f32 slab, or the per-unit reduction's accumulator, the whole
    // layout's in bf16 or at ZeRO 2-3 this rank's shard's: dist/tied_gradient.h.)
    tied_->sum(tied_model().grad_sums());
  }
  r.loss = step_loss_mean(loss_sum, step_loss, int64_t{spec_.grad_accum} * W_);
  r.update = update(r.lr, r.loss, r.loss_scale, r.update_gathered);
  // An overflow at the scale's floor is not something a smaller scale can fix (a non-finite
  // weight, say): stop as fp32 and bf16 do instead of skipping every step from here on.
  if (r.update.skipped && r.loss_scale <= settings_.loss_scaler.min_scale)
    r.update.non_finite = true;
  const dist::CommunicatorTensorGroup::Volume& tensor_after = tensor_.volume();
  r.tensor_comm = {tensor_after.all_reduce_bytes - tensor_before.all_reduce_bytes,
                   tensor_after.all_reduce_count - tensor_before.all_reduce_count,
                   tensor_after.gathered_bytes - tensor_before.gathered_bytes,
                   tensor_after.reduce_scatter_bytes - tensor_before.reduce_scatter_bytes,
                   tensor_after.reduce_scatter_count - tensor_before.reduce_scatter_count,
                   tensor_after.seconds - tensor_before.seconds,
                   tensor_after.overlapped_seconds - tensor_before.overlapped_seconds,
                   tensor_after.waited_seconds - tensor_before.waited_seconds};
  check_finite(step, r);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.rate = tokens_per_step_ / r.seconds;
  return r;
}

// The step's micro-batches, forward and backward; returns the sum of their losses (this rank's).
double TrainRun::micro_batches(int64_t step, const StepLoss& step_loss) {
  double loss_sum = 0;
  const float loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  for (int m = 0; m < spec_.grad_accum; ++m) {
    const profile::Scope batch(recorder(), fmt::format("micro-batch {}", m + 1),
                               profile::SliceKind::micro_batch);
    {
      const profile::Scope data(recorder(), "data", profile::SliceKind::data);
      train_data_->next_batch();
    }
    // --lora-dropout: this micro-batch's mask, from (seed, step, m, data rank) alone (Note
    // [LoRA], "Over data-parallel ranks"): each rank drops its own elements.
    gpt_->set_lora_dropout_draw(lora_dropout_draw(settings_.seed, step, m, comm_.rank()));
    loss_sum += micro_batch_loss(*gpt_, *train_data_, step_loss, /*training=*/true, loss_scale);
    // The last micro-batch's backward finishes the gradients: data parallelism sums each
    // bucket over the ranks as soon as the backward has finished it. (Per-unit gradients are
    // reduced by every backward.) LoRA's adapters are not in the base's slab whose offsets
    // the backward reports: their buckets all start in sync_->finish(), after the backward.
    if (sync_ && !gpt_->lora() && m + 1 == spec_.grad_accum)
      gpt_->backward([&](int64_t from) { sync_->final_from(from); });
    else
      gpt_->backward();
    params_io_waits();  // this micro-batch's, inside its slice
  }
  if (fused_ && fused_->second_pass()) {
    // --update-in-backward with global clipping: the first backward measured the norm; the
    // same micro-batch again steps every unit by its factor (Note [Update in backward]); the
    // planner prices it from the same decision (RunSpec::backward_passes, UnitSteps::passes).
    const profile::Scope again(recorder(), "micro-batch 1 (stepping pass)",
                               profile::SliceKind::micro_batch);
    micro_batch_loss(*gpt_, *train_data_, step_loss, /*training=*/true, loss_scale);
    gpt_->backward();
  }
  // --repeat-batch: back to the run's first micro-batch, so the next step reads the same rows
  // and a save records that position (a resume repeats the same batch).
  if (settings_.repeat_batch) train_data_->set_position(data_position_);
  return loss_sum;
}

// --pp (Note [Pipeline parallel]): the step's micro-batches through this stage in the
// schedule's order (dist/pipeline_runner.h). A stage before the last runs each micro-batch's
// forward to send its output on, and again before its backward from the kept input
// (re-materialisation); the last stage runs the forward with its backward, the loss with it.
// Each forward reads its micro-batch again from the loader (micro-batch `first + m`), so no
// stage holds the step's batches. Every stage's backwards run in micro-batch order, so the
// gradients and the losses (summed here in order, on the last stage) are one process's bits.
// Returns this stage's sum of the losses: the step's on the last stage, 0 on the others.
double TrainRun::pipeline_micro_batches(const StepLoss& step_loss) {
  const int M = spec_.grad_accum;
  const int64_t first = train_data_->position();
  std::vector<float> losses(static_cast<size_t>(M), 0.0f);
  pipeline_pass(step_loss, losses);
  if (fused_) {
    // --update-in-backward: the stages' norm once every stage's backward is done; with global
    // clipping that was the measuring pass, and the same micro-batch goes through the stages
    // again, each stepping its units by the factor (Note [Update in backward], "Under --pp").
    fused_->end_pipeline_pass();
    if (fused_->second_pass()) {
      std::vector<float> again(static_cast<size_t>(M), 0.0f);
      pipeline_pass(step_loss, again);
      fused_->end_pipeline_pass();
    }
  }
  gpt_->set_stage_io({});
  train_data_->set_position(settings_.repeat_batch ? data_position_ : first + M);
  double loss_sum = 0;
  for (float l : losses) loss_sum += l;
  return loss_sum;
}

// --pp: one pass of the step's micro-batches through this stage (pipeline_micro_batches), each
// one's loss into `losses` on the last stage.
void TrainRun::pipeline_pass(const StepLoss& step_loss, std::vector<float>& losses) {
  const int M = spec_.grad_accum;
  const float loss_scale = scaler_ ? scaler_->scale() : 1.0f;
  const int64_t first = train_data_->position();
  const bool last = mc_.stage.has_head();
  auto load = [&](int m) {
    const profile::Scope data(recorder(), "data", profile::SliceKind::data);
    train_data_->set_position(first + m);
    train_data_->next_batch();
  };
  runner_->run(
      {[&](int m, std::span<const float> in, std::span<float> out) {
         if (last) return;  // its forward runs with the backward
         const profile::Scope batch(recorder(), fmt::format("micro-batch {} forward", m + 1),
                                    profile::SliceKind::micro_batch);
         load(m);
         gpt_->set_stage_io({in.data(), out.data(), nullptr, nullptr});
         micro_batch_loss(*gpt_, *train_data_, step_loss, /*training=*/false);
       },
       [&](int m, std::span<const float> in, std::span<const float> dout, std::span<float> din) {
         const profile::Scope batch(recorder(), fmt::format("micro-batch {}", m + 1),
                                    profile::SliceKind::micro_batch);
         load(m);
         gpt_->set_stage_io({in.data(), nullptr, dout.data(), din.data()});
         losses[static_cast<size_t>(m)] =
             micro_batch_loss(*gpt_, *train_data_, step_loss, /*training=*/true, loss_scale);
         // The last backward finishes the stage's gradients: the data group sums each bucket
         // as the backward finishes it, as micro_batches does.
         // (LoRA: the adapters' buckets all start in finish(), as in micro_batches.)
         if (sync_ && !gpt_->lora() && m + 1 == M)
           gpt_->backward([&](int64_t from) { sync_->final_from(from); });
         else
           gpt_->backward();
       }});
  train_data_->set_position(first);
}

// --pp: `x` as the last stage has it, on every stage of this rank's pipeline (the loss for the
// log, the progress line and the non-finite stop: every rank decides alike). Itself otherwise.
double TrainRun::from_last_stage(double x) {
  if (pipe_.size() > 1) pipe_.broadcast(&x, sizeof x, pipe_.size() - 1);
  return x;
}

// fp16's scaler absorbs a non-finite loss as an overflow (the step is skipped); in fp32 and
// bf16 nothing can, so the run stops before anything is saved over the last checkpoint.
UpdateOutcome TrainRun::update(float lr, float loss, float loss_scale,
                               int64_t& update_gathered) {
  UpdateOutcome u;
  if (!scaler_ && !std::isfinite(loss)) {
    u.non_finite = true;
    return u;
  }
  const profile::Scope slice(recorder(), "optimizer", profile::SliceKind::optimizer);
  const RankShards* shards = rank_shards_ ? &*rank_shards_ : nullptr;
  if (fused_) {
    u = backward_update_outcome(fused_->result());  // stepped during the backward
    u.gathered_bytes = publish_working_weights(*gpt_, my_shard_ ? shards : nullptr);
    if (off_) offload_io_waits();  // the backward's, on the optimizer's files
    return u;
  }
  if (!chunks_.empty()) return chunk_update(lr);
  if (off_)
    return apply_update(
        *gpt_, [&](float rate, float scale) { offloaded_step(rate, scale, update_gathered); },
        scaler_.get(), lr, spec_.clip, spec_.grad_accum * W_, shards,
        runner_ ? &pipe_ : nullptr);
  return apply_update(*gpt_, *opt_, scaler_.get(), lr, spec_.clip, spec_.grad_accum * W_,
                      shards, runner_ ? &pipe_ : nullptr);
}

// The offloaded optimizer's step over this rank's range of the working weights and gradients
// (the whole layout in one process); under ZeRO stages 1-2 the updated working weights are then
// all-gathered. At stage 3 the working weights are the shard itself, and only the persistent
// units are gathered again, as the in-RAM update does (counted by the model:
// take_gathered_bytes). With --offload-grads each piece's gradients are read from their file.
void TrainRun::offloaded_step(float rate, float scale, int64_t& update_gathered) {
  if (gpt_->params_offloaded()) {
    // Each block's new working weights written back to its file.
    if (grads_file_)
      off_->step(*zero_.weights, *grads_file_, rate, scale);
    else
      off_->step(*zero_.weights, gpt_->grad_sums(my_range_), rate, scale);
  } else {
    Tensor working = gpt_->params_sharded() ? gpt_->params() : my_part(gpt_->params());
    if (grads_file_)
      off_->step(working, *grads_file_, rate, scale);
    else
      off_->step(working, gpt_->grad_sums(my_range_), rate, scale);
  }
  if (grads_file_) grads_file_->set_step(off_->steps_taken());
  update_gathered = publish_working_weights(*gpt_, my_shard_ ? &*rank_shards_ : nullptr);
  params_io_waits();  // the update's, on the working weights' file
  offload_io_waits();
}

// --profile: the offloaded optimizer's waits on its files, as io slices.
void TrainRun::offload_io_waits() {
  for (const offload::IoWait& w : off_->take_waits())
    if (profile::StepRecorder* rec = recorder())
      rec->add("io wait", profile::SliceKind::io_wait, w.t0, w.t1);
}

void TrainRun::check_finite(int64_t step, const StepResult& r) {
  if (!r.update.non_finite) return;
  const std::string culprit = gpt_->first_non_finite();
  MEMFIT_THROW(Error, "train",
               "step {}: the {} became non-finite (loss {}); the first non-finite tensor is "
               "{}. Stopping without saving over the last checkpoint{}",
               step + 1, std::isfinite(r.loss) ? "gradient" : "loss", r.loss,
               culprit.empty() ? "not found (the loss itself)" : culprit,
               saved_at_ > 0 ? fmt::format(" (step {})", saved_at_) : "");
}

// The first eval_batches micro-batches of the validation split, in order. With W ranks a
// micro-batch is W x B rows and each rank evaluates its B of them (its loader's rows), so the
// work is split and the mean is over every row, as one process with batch W x B.
float TrainRun::evaluate() {
  if (!val_data_) return -1;
  const profile::Scope slice(recorder(), "evaluation", profile::SliceKind::evaluation);
  val_data_->set_position(0);
  const int64_t n = std::min<int64_t>(settings_.eval_batches, val_data_->batches_per_epoch());
  const StepLoss eval_loss = step_loss_begin(*val_data_, n, 1, 1.0f);  // masks: masked_loss.h
  double sum = 0;
  auto batch = [&](int64_t i) {
    const profile::Scope slice(recorder(), fmt::format("evaluation batch {}", i + 1),
                               profile::SliceKind::micro_batch);
    {
      const profile::Scope data(recorder(), "data", profile::SliceKind::data);
      val_data_->next_batch();
    }
    sum += micro_batch_loss(*gpt_, *val_data_, eval_loss, /*training=*/false);
  };
  if (runner_ && runner_->virtual_stages() > 1) {
    sum = from_last_stage(chunk_evaluate(eval_loss, n));
  } else if (runner_) {
    // --pp: the forwards through the stages in turn; the loss is the last stage's.
    runner_->run_forwards(static_cast<int>(n),
                          [&](int i, std::span<const float> in, std::span<float> out) {
                            gpt_->set_stage_io({in.data(), out.data(), nullptr, nullptr});
                            batch(i);
                          });
    gpt_->set_stage_io({});
    sum = from_last_stage(sum);
  } else {
    for (int64_t i = 0; i < n; ++i) batch(i);
  }
  if (W_ == 1) return step_loss_mean(sum, eval_loss, n);
  // Stage 3's gathers for the evaluation are not a training step's (comm_bytes).
  gpt_->take_gathered_bytes();
  const profile::Scope all(recorder(), "loss all-reduce", profile::SliceKind::collective);
  const float summed = sum_ranks(static_cast<float>(sum));
  return eval_loss.masked ? step_loss_mean(summed, eval_loss, n * W_)
                          : summed / static_cast<float>(n * W_);
}

// SIGINT or SIGTERM: every rank stops after the same step, the first where any rank was
// signalled (summary.interrupted_by says which signal).
bool TrainRun::stop_requested() {
  summary_.interrupted_by = interrupt_signal();
  if (runner_) {
    // --pp: every rank of the world, whichever stage or data rank was signalled.
    dist::Communicator& world = grid_.world();
    const size_t n = static_cast<size_t>(world.size());
    std::vector<int32_t> signals(n);
    const int32_t mine = summary_.interrupted_by;
    world.all_gather(&mine, signals.data(), std::vector<int64_t>(n, 1), sizeof(int32_t));
    for (int32_t sig : signals)
      if (sig && !summary_.interrupted_by) summary_.interrupted_by = SIGTERM;
  } else if (W_ > 1) {
    const float any = sum_ranks(summary_.interrupted_by ? 1.0f : 0.0f);
    if (any > 0 && !summary_.interrupted_by) summary_.interrupted_by = SIGTERM;
  }
  return summary_.interrupted_by != 0;
}

}  // namespace memfit
