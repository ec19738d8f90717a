// The step recorder: the phases the running step enters, in the plan's order, nested in the
// trainer's slices, and each buffer's spans derived from the uses the running code made, which
// must be the plan's lifetimes (for a training micro-batch) in both families and with
// recomputation; an evaluation forward ends its buffers at their last read.
#include "memfit/profile/step_recorder.h"

#include <gtest/gtest.h>

#include "profile_test_util.h"

namespace memfit {
namespace {

using profile_test::RecordedRun;

// The spans the recorder observed in micro-batch `mb`, per buffer, as phase indexes.
std::vector<std::vector<LiveSpan>> observed(const profile::StepRecorder& rec, int mb) {
  std::vector<std::vector<LiveSpan>> out(rec.plan().buffers.size());
  for (const profile::BufferSpanRun& s : rec.spans()) {
    if (rec.phase_runs()[s.first_run].micro_batch != mb) continue;
    out[s.buffer].push_back(
        {rec.phase_runs()[s.first_run].phase, rec.phase_runs()[s.last_run].phase});
  }
  return out;
}

void expect_training_spans_are_the_plans(Family family, const char* ckpt,
                                         bool grads_in_arena = false) {
  RecordedRun run(family, ckpt, 2, 13, grads_in_arena);
  const profile::StepRecorder& rec = *run.recorder;
  ASSERT_EQ(rec.micro_batches().size(), 2u);
  EXPECT_TRUE(rec.micro_batches()[0].training);
  EXPECT_FALSE(rec.micro_batches()[1].training);
  const StepPlan& plan = rec.plan();
  // The training micro-batch ran every phase of the plan, in order.
  const auto& mb = rec.micro_batches()[0];
  ASSERT_EQ(mb.end_run - mb.first_run, static_cast<int>(plan.phases.size()));
  for (int r = mb.first_run; r < mb.end_run; ++r) EXPECT_EQ(rec.phase_runs()[r].phase, r - mb.first_run);
  const auto spans = observed(rec, 0);
  for (size_t i = 0; i < plan.buffers.size(); ++i)
    EXPECT_EQ(spans[i], plan.buffers[i].lifetime.spans) << plan.buffers[i].tag << " with " << ckpt;
}

TEST(StepRecorder, TrainingSpansAreThePlansLifetimesGpt2) {
  expect_training_spans_are_the_plans(Family::gpt2, "none");
  expect_training_spans_are_the_plans(Family::gpt2, "full");
  // The gradient units in the arena: born where the plan says, read by the update at the end.
  expect_training_spans_are_the_plans(Family::gpt2, "none", /*grads_in_arena=*/true);
}

TEST(StepRecorder, TrainingSpansAreThePlansLifetimesLlama) {
  expect_training_spans_are_the_plans(Family::llama, "none");
  expect_training_spans_are_the_plans(Family::llama, "every:2");
  expect_training_spans_are_the_plans(Family::llama, "every:2", /*grads_in_arena=*/true);
}

TEST(StepRecorder, EvaluationRunsTheForwardPhasesAndEndsBuffersAtTheirLastRead) {
  RecordedRun run;
  const profile::StepRecorder& rec = *run.recorder;
  const StepPlan& plan = rec.plan();
  const auto& mb = rec.micro_batches()[1];
  // embedding, the blocks, the final norm, the LM head.
  EXPECT_EQ(mb.end_run - mb.first_run, 3 + 2);
  EXPECT_EQ(plan.phases[rec.phase_runs()[mb.end_run - 1].phase].kind, PhaseKind::lm_head);
  const auto spans = observed(rec, 1);
  for (size_t i = 0; i < plan.buffers.size(); ++i)
    if (plan.buffers[i].tag == "h.0.fch") {
      // Saved for a backward that never comes: live in its own phase only.
      ASSERT_EQ(spans[i].size(), 1u);
      EXPECT_EQ(spans[i][0].first, spans[i][0].last);
    }
}

TEST(StepRecorder, PhasesNestInTheirSlices) {
  RecordedRun run;
  const profile::StepRecorder& rec = *run.recorder;
  ASSERT_EQ(rec.slices().size(), 4u);  // step, micro-batch, evaluation, evaluation batch
  EXPECT_EQ(rec.slices()[0].depth, 0);
  EXPECT_EQ(rec.slices()[1].depth, 1);
  EXPECT_EQ(rec.slices()[3].depth, 2);
  for (const profile::SliceRun& s : rec.slices()) EXPECT_LE(s.t0, s.t1) << s.name;
  const profile::SliceRun& train = rec.slices()[1];
  const profile::SliceRun& eval = rec.slices()[3];
  for (const profile::PhaseRun& r : rec.phase_runs()) {
    const profile::SliceRun& in = rec.micro_batches()[r.micro_batch].training ? train : eval;
    EXPECT_LE(in.t0, r.t0);
    EXPECT_LE(r.t0, r.t1);
    EXPECT_LE(r.t1, in.t1);
  }
  EXPECT_GT(rec.bytes(), 0u);
}

TEST(StepRecorder, RecordsNothingAfterStop) {
  RecordedRun run;
  const size_t runs = run.recorder->phase_runs().size();
  run.recorder->step_phase(0);
  run.recorder->begin("late", profile::SliceKind::save);
  EXPECT_EQ(run.recorder->phase_runs().size(), runs);
  EXPECT_EQ(run.recorder->slices().size(), 4u);
}

// A finished interval handed over later (an offloaded update's wait on the disk) nests in the
// open slice at the times it was given, in the recorder's time; after stop() it is dropped.
TEST(StepRecorder, AddedSliceNestsAtItsOwnTimes) {
  const auto origin = std::chrono::steady_clock::now();
  profile::StepRecorder rec(origin);
  rec.begin("optimizer", profile::SliceKind::optimizer);
  rec.add("io wait", profile::SliceKind::io_wait, origin + std::chrono::nanoseconds(1500),
          origin + std::chrono::nanoseconds(4000));
  rec.end();
  ASSERT_EQ(rec.slices().size(), 2u);
  const profile::SliceRun& w = rec.slices()[1];
  EXPECT_EQ(w.name, "io wait");
  EXPECT_EQ(profile::slice_kind_name(w.kind), "io");
  EXPECT_EQ(w.t0, 1500);
  EXPECT_EQ(w.t1, 4000);
  EXPECT_EQ(w.depth, 1);
  rec.stop();
  rec.add("late", profile::SliceKind::io_wait, origin, origin);
  EXPECT_EQ(rec.slices().size(), 2u);
}

TEST(StepRecorder, RefusesASecondPlanOfAnotherShape) {
  RecordedRun run;
  profile::StepRecorder rec(std::chrono::steady_clock::now());
  rec.set_plan(run.model->step_plan());
  rec.step_phase(0);
  rec.step_finish();
  const StepPlan other = plan_step(run.model->config(), 1, 5, {});
  EXPECT_THROW(rec.set_plan(other), Error);
}

}  // namespace
}  // namespace memfit
