// The timeline: its pool account is the pool's (the largest total is the pool's peak), the bytes
// holding live values never pass it, inside a training micro-batch's phases they are the plan's
// live bytes of that phase, and the buffers listed at the live peak add up to it.
#include "memfit/profile/timeline.h"

#include <gtest/gtest.h>

#include "profile_test_util.h"

namespace memfit {
namespace {

using profile_test::RecordedRun;

TEST(Timeline, PoolPeakIsThePoolsAndLiveBytesNeverPassTheAccount) {
  // (With the gradient units in the activations arena, whose account they share, too.)
  for (auto [ckpt, in_arena] : {std::pair{"none", false}, {"full", false}, {"none", true}}) {
    SCOPED_TRACE(in_arena ? "gradients in the arena" : "gradients in their slab");
    RecordedRun run(Family::gpt2, ckpt, 2, 13, in_arena);
    const auto tl = profile::build_timeline(*run.recorder, run.pool.events(), run.begin, run.end);
    EXPECT_EQ(tl.pool_peak, run.pool.bytes_peak()) << ckpt;
    ASSERT_FALSE(tl.samples.empty());
    for (const profile::Sample& s : tl.samples) {
      EXPECT_LE(s.live_total(), s.pool_total());
      for (size_t c = 0; c < kNumCategories; ++c) EXPECT_LE(s.live[c], s.pool[c]);
    }
    const StepPlan& plan = run.model->step_plan();
    for (Category c : {Category::activations, Category::workspace})
      EXPECT_EQ(tl.arena[static_cast<size_t>(c)], plan.arena[static_cast<size_t>(c)]);
  }
}

TEST(Timeline, LiveArenaBytesInEachTrainingPhaseAreThePlans) {
  for (Family f : {Family::gpt2, Family::llama}) {
    for (bool in_arena : {false, true}) {
      SCOPED_TRACE(in_arena ? "gradients in the arena" : "gradients in their slab");
      RecordedRun run(f, "full", 2, 13, in_arena);
      const profile::StepRecorder& rec = *run.recorder;
      const auto tl = profile::build_timeline(rec, run.pool.events(), run.begin, run.end);
      const StepPlan& plan = rec.plan();
      const auto& mb = rec.micro_batches()[0];
      for (int r = mb.first_run; r < mb.end_run; ++r) {
        const profile::PhaseRun& run_r = rec.phase_runs()[r];
        // The sample in force in the middle of the phase (after every change at its start).
        const profile::Sample* in = nullptr;
        for (const profile::Sample& s : tl.samples)
          if (s.t <= run_r.t0) in = &s;
        ASSERT_NE(in, nullptr);
        const PhaseBytes& want = plan.live[run_r.phase];
        // The gradient units' live bytes count in the arena that holds them.
        EXPECT_EQ(in->live[static_cast<size_t>(Category::activations)],
                  want.activations + want.grads)
            << plan.phases[run_r.phase].name();
        EXPECT_EQ(in->live[static_cast<size_t>(Category::workspace)], want.workspace)
            << plan.phases[run_r.phase].name();
        // No gradient is born before the LM head.
        const PhaseKind kind = plan.phases[run_r.phase].kind;
        const bool before_head = kind == PhaseKind::embedding || kind == PhaseKind::forward ||
                                 kind == PhaseKind::final_norm;
        EXPECT_EQ(want.grads > 0, in_arena && !before_head) << plan.phases[run_r.phase].name();
      }
    }
  }
}

TEST(Timeline, BuffersAtTheLivePeakAddUpToIt) {
  RecordedRun run;
  const auto tl = profile::build_timeline(*run.recorder, run.pool.events(), run.begin, run.end);
  ASSERT_GE(tl.live_peak_run, 0);
  size_t sum = 0;
  for (const profile::PeakBuffer& b : tl.peak_buffers) sum += b.bytes;
  EXPECT_EQ(sum, tl.live_peak);
  for (size_t i = 1; i < tl.peak_buffers.size(); ++i)
    EXPECT_GE(tl.peak_buffers[i - 1].bytes, tl.peak_buffers[i].bytes);
  // The slabs are there, and no arena stands in for its buffers.
  bool params = false;
  for (const profile::PeakBuffer& b : tl.peak_buffers) {
    params |= b.tag == "params" && !b.in_arena;
    EXPECT_EQ(b.tag.find(" arena"), std::string::npos);
  }
  EXPECT_TRUE(params);
  EXPECT_GE(tl.live_peak_t, run.begin);
  EXPECT_LE(tl.live_peak_t, run.end);
}

TEST(Timeline, PhaseRunNamesSayTheStepAndTheMicroBatch) {
  RecordedRun run;
  EXPECT_EQ(profile::phase_run_name(*run.recorder, 0), "embedding (step 1, micro-batch 1)");
  const int eval_first = run.recorder->micro_batches()[1].first_run;
  EXPECT_EQ(profile::phase_run_name(*run.recorder, eval_first),
            "embedding (step 1, evaluation batch 1)");
}

}  // namespace
}  // namespace memfit
