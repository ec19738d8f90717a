// train(): the run resolved and agreed by every rank, then set up (train/train_run.h) and run
// step by step: each step logged, evaluated and saved when due, until the last step or a signal;
// then the final save and every rank's peak.
#include "memfit/train/trainer.h"

#include <fmt/format.h>

#include "memfit/io/data/data_loader.h"
#include "memfit/memory/rss.h"
#include "memfit/train/run_agreement.h"
#include "memfit/train/train_run.h"

namespace memfit {

TrainSummary train(const TrainSpec& spec, dist::ProcessGrid& grid) {
  // Data parallelism: every rank runs this with its own rows of each global micro-batch
  // (docs/data.md, "Ranks"); the ranks agree on the run over the whole world.
  MEMFIT_CHECK(spec.run.world == grid.data().size(), "train",
               "the run was resolved for {} data-parallel ranks, the grid has {}", spec.run.world,
               grid.data().size());
  // Ranks that disagree about the run fail here, every rank alike, before anything is built
  // (Note [Failures] in docs/notes/zero.md).
  if (grid.world().size() > 1) dist::check_ranks_agree(grid.world(), run_agreement_fields(spec));
  // A --save the run could not write fails now, not after the steps whose result it keeps. Rank
  // 0's check (its probe's name has its pid, which another host may share); a rank's error ends
  // every rank (Note [Failures] in docs/notes/zero.md).
  if (grid.world().rank() == 0 && !spec.save_dir.empty())
    io::check_checkpoint_writable(spec.save_dir);
  // Shards from another tokenizer fail now, not after the model's set-up (minutes at 7B); the
  // loader checks every token again when it opens them.
  if (spec.run.steps > 0)
    io::check_dataset_vocab(spec.run.data_dir, spec.run.model.vocab_size, spec.vocab_source);
  TrainRun run(grid, spec);
  return run.run();
}

TrainSummary TrainRun::run() {
  progress_.emplace(last_step_, stderr, std::max<int64_t>(1, last_step_ / 20));
  interrupts_.emplace();  // SIGINT/SIGTERM: stop after this step, then save as below
  last_save_ = std::chrono::steady_clock::now();
  tokens_per_step_ = double(B_) * T_ * spec_.grad_accum * W_;  // every rank's
  gpt_->take_gathered_bytes();  // stage 3: the gathers after initialisation or loading
  for (int64_t step = start_step_; step < last_step_; ++step) {
    run_step(step);
    if (summary_.interrupted_by) break;
  }
  if (lead_) progress_->finish();
  const int64_t final_step = start_step_ + summary_.steps_run;
  if (!settings_.save_dir.empty() && saved_at_ != final_step) {
    const Tensor record = record_for_save();
    stage_shards();
    if (lead_) save(final_step, record);
  }
  comm_.barrier();  // the save is complete before any rank reports the run done
  if (grid_.world().size() > 1) log_rank_peaks();
  summary_.saved = !settings_.save_dir.empty();
  summary_.last_step = final_step;
  finish_summary();
  return summary_;
}

// One step (0-based `step`) and what follows it: the log line, the evaluation when due, the
// progress line, a save when due, the leak check at the step boundary, and whether to stop.
void TrainRun::run_step(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  pool_.set_phase(fmt::format("step {}", step + 1));
  if (profiler_) profiler_->step_begin(step + 1);
  if (recorder()) recorder()->set_step(step + 1);
  std::optional<profile::Scope> step_slice;
  step_slice.emplace(recorder(), fmt::format("step {}", step + 1), profile::SliceKind::step);
  const StepResult r = this->step(step, t0);
  rates_.push_back(r.rate);
  summary_.losses.push_back(r.loss);
  summary_.last_loss = r.loss;
  ++summary_.steps_run;
  log_step(step, r);
  std::string text = progress_text(r);
  const bool last = step + 1 == last_step_;
  if (val_data_ && ((settings_.eval_every && (step + 1) % settings_.eval_every == 0) || last)) {
    summary_.last_val_loss = evaluate();
    log_line({{"step", step + 1}, {"val_loss", summary_.last_val_loss}});
    text += fmt::format(" | val {:.4f}", summary_.last_val_loss);
  }
  if (lead_) progress_->update(step + 1, text);
  save_if_due(step + 1, last);
  // The tests' deliberate leak, from the second step on.
  if (settings_.test_leak_bytes > 0 && step > start_step_)
    test_leaks_.push_back(pool_.allocate(static_cast<size_t>(settings_.test_leak_bytes),
                                       Category::workspace, "test.leak"));
  step_slice.reset();
  if (profiler_ && profiler_->step_end(step + 1)) {
    gpt_->set_step_observer(nullptr);
    if (off_) off_->record_waits(false);
    if (param_file_) param_file_->record_waits(false);
  }
  leaks_.boundary(step + 1, pool_, process_rss_bytes());
  stop_requested();
}

}  // namespace memfit
