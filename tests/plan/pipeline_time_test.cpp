// A pipelined step's time (plan/pipeline_time.h; Note [Pipeline parallel], "The step's time"):
// the schedule's m + p - 1 slots, so a bubble of (p - 1)/m of the ideal; the transfers priced
// on each cut's link; a stage's estimate counting its own blocks, the head on the last stage
// and the re-materialised forward on the others; and `--pp-layers auto`, which gives a heavy
// head fewer blocks, is the best cut by time, and balances memory where --mem-limit binds.
#include "memfit/plan/pipeline_time.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/core/error.h"
#include "memfit/plan/calibration.h"
#include "memfit/plan/memory_plan.h"
#include "plan_test_util.h"

namespace memfit {
namespace {

Calibration rates() {
  Calibration r;
  r.gemm = {{96, 1e11, 1e11, 2e11, 2e11}, {768, 1.2e11, 1.2e11, 2.4e11, 2.4e11}};
  r.attention_f32 = 5e10;
  r.attention_bf16 = 8e10;
  r.elementwise_bytes_per_s = 1e10;
  r.stream_bytes_per_s = 2e10;
  r.copy_bytes_per_s = 1e10;
  return r;
}

// A stage's estimate: `compute` seconds of micro-batches (m of them) and `update` once.
StepTime stage(double compute, double update) {
  StepTime t;
  t.block_gemm = compute;
  t.optimizer = update;
  return t;
}

TEST(PipelineTime, TheBubbleIsPMinusOneOverMOfTheIdeal) {
  const Calibration r = rates();
  for (int P : {2, 4, 8})
    for (int m : {1, 2, 4, 8, 16}) {
      const std::vector<StepTime> stages(static_cast<size_t>(P), stage(0.1 * m, 0.05));
      const std::vector<Link> cuts(static_cast<size_t>(P - 1), Link{1e9, 0});
      const std::vector<bool> inter(static_cast<size_t>(P - 1), false);
      const PipelineTime t = pipeline_time(stages, m, 0, cuts, inter, r);
      EXPECT_DOUBLE_EQ(t.slot, 0.1);
      EXPECT_DOUBLE_EQ(t.step, (m + P - 1) * 0.1 + 0.05) << P << " x " << m;
      EXPECT_DOUBLE_EQ(t.bubble() / (m * t.slot), double(P - 1) / m) << P << " x " << m;
      EXPECT_DOUBLE_EQ(t.bubble_fraction(), double(P - 1) / m);
      EXPECT_DOUBLE_EQ(t.bubble_share(), (P - 1) * 0.1 / t.step);
      EXPECT_DOUBLE_EQ(t.stage_step(0), t.step);
    }
  // One stage: no bubble, the step is the stage's own estimate.
  const PipelineTime one = pipeline_time({stage(0.8, 0.05)}, 8, 1 << 20, {}, {}, r);
  EXPECT_DOUBLE_EQ(one.step, 0.85);
  EXPECT_EQ(one.bubble(), 0.0);
  EXPECT_EQ(one.p2p_bytes, 0);
}

// Interleaved over V chunks a rank: m V + p - 1 slots of a chunk's micro-batch (a V-th of a
// stage's), so the bubble is (p - 1)/(V m) of the ideal; each chunk's transfers are its own
// (V of each kind a micro-batch), the wrap from the last stage to the first on the inter link
// where any cut is.
TEST(PipelineTime, InterleavingDividesTheBubbleByTheChunks) {
  const Calibration r = rates();
  for (int P : {2, 4})
    for (int V : {2, 3})
      for (int m : {P, 2 * P, 4 * P}) {
        const std::vector<StepTime> stages(static_cast<size_t>(P), stage(0.1 * m, 0.05));
        const std::vector<Link> cuts(static_cast<size_t>(P - 1), Link{1e9, 0});
        const std::vector<bool> inter(static_cast<size_t>(P - 1), false);
        const PipelineTime t = pipeline_time(stages, m, 0, cuts, inter, r, V);
        EXPECT_DOUBLE_EQ(t.slot, 0.1 / V);
        EXPECT_EQ(t.slots(), m * V + P - 1);
        EXPECT_DOUBLE_EQ(t.step, (m * V + P - 1) * 0.1 / V + 0.05) << P << " x " << m;
        EXPECT_DOUBLE_EQ(t.bubble_fraction(), double(P - 1) / (V * m));
        EXPECT_DOUBLE_EQ(t.bubble() / (m * V * t.slot), double(P - 1) / (V * m));
        EXPECT_DOUBLE_EQ(t.stage_step(0), t.step);
        const PipelineTime flat = pipeline_time(stages, m, 0, cuts, inter, r);
        EXPECT_LT(t.step, flat.step);
        EXPECT_NEAR(flat.step - t.step, (P - 1) * 0.1 * (1 - 1.0 / V), 1e-12);
      }
  // Transfers, 2 stages of 2 chunks: each stage receives 3 messages a micro-batch (stage 0:
  // chunk 1's input over the wrap and both chunks' gradients; stage 1: both inputs and chunk
  // 0's gradient over the wrap).
  const Link intra{1e10, 1e-6}, inter{1e9, 5e-6};
  const int64_t bytes = 1'000'000;
  const double one = 1e6 / 1e10 + 1e-6, far = 1e6 / 1e9 + 5e-6;
  const PipelineTime two =
      pipeline_time({stage(0.4, 0), stage(0.4, 0)}, 4, bytes, {intra}, {false}, r, 2);
  EXPECT_DOUBLE_EQ(two.p2p[0], 3 * one);
  EXPECT_DOUBLE_EQ(two.p2p[1], 3 * one);
  EXPECT_DOUBLE_EQ(two.slot, (0.1 + 3 * one) / 2);
  EXPECT_EQ(two.cut_inter, (std::vector<bool>{false, false}));
  // 3 stages, the second cut across nodes: the wrap too.
  const PipelineTime three = pipeline_time({stage(0.3, 0), stage(0.3, 0), stage(0.3, 0)}, 3,
                                           bytes, {intra, inter}, {false, true}, r, 2);
  EXPECT_EQ(three.cut_inter, (std::vector<bool>{false, true, true}));
  EXPECT_DOUBLE_EQ(three.p2p[0], 1 * far + 2 * one);  // chunk 1's input over the wrap
  EXPECT_DOUBLE_EQ(three.p2p[1], 2 * one + 2 * far);
  EXPECT_DOUBLE_EQ(three.p2p[2], 2 * far + 1 * far);  // chunk 0's gradient over the wrap
  // The refusals of the schedule: m not a multiple of P.
  EXPECT_THROW(pipeline_time({stage(0.3, 0), stage(0.3, 0)}, 3, 0, {intra}, {false}, r, 2),
               ConfigError);
}

// Each stage receives its input (on the cut before it) and its output's gradient (on the cut
// after it), one message each, and waits for them (its sends overlap its compute); the slowest
// stage's slot sets the pace.
TEST(PipelineTime, TransfersArePricedOnEachCutsLinkAndTheSlowestStageSetsThePace) {
  const Calibration r = rates();
  const Link intra{1e10, 1e-6}, inter{1e9, 5e-6};
  const int64_t bytes = 1'000'000;
  const std::vector<StepTime> stages = {stage(0.4, 0.01), stage(0.4, 0.02), stage(0.4, 0.03)};
  const PipelineTime t = pipeline_time(stages, 4, bytes, {intra, inter}, {false, true}, r);
  EXPECT_DOUBLE_EQ(t.p2p[0], 1e6 / 1e10 + 1e-6);
  EXPECT_DOUBLE_EQ(t.p2p[1], 1e6 / 1e10 + 1e-6 + 1e6 / 1e9 + 5e-6);
  EXPECT_DOUBLE_EQ(t.p2p[2], 1e6 / 1e9 + 5e-6);
  EXPECT_EQ(t.slowest, 1);  // the stage on both cuts
  EXPECT_DOUBLE_EQ(t.slot, 0.1 + t.p2p[1]);
  EXPECT_NEAR(t.once_most, 0.03, 1e-15);  // (0.4 + 0.03) - 0.4
  EXPECT_DOUBLE_EQ(t.step, 6 * t.slot + t.once_most);
  EXPECT_EQ(t.p2p_bytes, bytes);
  // A stage twice as slow as the others sets the slot alone.
  const PipelineTime slow =
      pipeline_time({stage(0.4, 0), stage(0.4, 0), stage(0.8, 0)}, 4, 0,
                    {Link{1e9, 0}, Link{1e9, 0}}, {false, false}, r);
  EXPECT_EQ(slow.slowest, 2);
  EXPECT_DOUBLE_EQ(slow.slot, 0.2);
}

// A stage's estimate counts its own blocks: the head on the last stage alone, the embeddings'
// and head's element-wise work where they are, and on every stage but the last the blocks'
// forward once more (the re-materialisation). Two stages of two blocks: 4 + 2 (again) forwards
// of the matmuls where one process runs 4 (3 FLOP units each: 12 + 2 = 14 of 12), and the
// attention 4 x 4 + 2 of 16 with flash.
TEST(PipelineTime, AStagesEstimateCountsItsOwnBlocks) {
  const Calibration r = rates();
  StepTimeInputs whole;
  whole.model = ModelConfig::preset("llama-tiny");
  whole.model.n_layer = 4;
  whole.model.finalize();
  whole.B = 2;
  whole.T = 32;
  whole.param_count = 1000;
  StepTimeInputs first = whole, last = whole;
  first.model.set_pipeline_stage({0, 2, 0, 2});
  last.model.set_pipeline_stage({1, 2, 2, 4});
  const StepTime w = estimate_step_time(whole, r), a = estimate_step_time(first, r),
                 b = estimate_step_time(last, r);
  EXPECT_EQ(a.head_gemm, 0.0);
  EXPECT_NEAR(b.head_gemm, w.head_gemm, 1e-12 * w.head_gemm);
  EXPECT_NEAR(b.block_gemm, w.block_gemm / 2, 1e-12 * w.block_gemm);
  EXPECT_NEAR(a.block_gemm + b.block_gemm, w.block_gemm * 14 / 12, 1e-12 * w.block_gemm);
  EXPECT_NEAR(a.attention + b.attention, w.attention * 18 / 16, 1e-12 * w.attention);
  for (const StepTime* t : {&a, &b}) {
    EXPECT_GT(t->block_gemm, 0);
    EXPECT_GT(t->attention, 0);
    EXPECT_GT(t->elementwise, 0);
  }
  // Element-wise: the head's softmax and final norm on the last stage, the embedding on the
  // first, each stage's input or output copied (2C) where the other is; the first stage's
  // forward again: 2 blocks' forward (10C + 3F + 2QK: 2016 at C 96, F 256, QK 144) and 4C more
  // than one process, per token of 64 at 4 bytes.
  const double C = 96, F = 256, QK = 144;
  EXPECT_NEAR(a.elementwise + b.elementwise - w.elementwise,
              (2 * (10 * C + 3 * F + 2 * QK) + 4 * C) * 64 * 4 / r.elementwise_bytes_per_s,
              1e-12 * w.elementwise);
}

TrainConfig pipe_config(int layers, int pp, int vocab) {
  TrainConfig c;
  c.model = "llama-tiny";
  c.n_layer = layers;
  c.vocab = vocab;
  c.seq_len = 32;
  c.batch = 2;
  c.grad_accum = 4;
  c.steps = 0;
  c.pp = pp;
  c.ranks = pp;
  c.data_dir = test::empty_data_dir("pipeline_time");
  return c;
}

// Each stage planned whole (plan_training of its stage), then the pipeline's step.
PipelineTime planned(const RunSpec& spec, std::vector<size_t>* peaks = nullptr) {
  std::vector<PlanReport> stages;
  for (int s = 0; s < spec.pp(); ++s) {
    stages.push_back(plan_training(spec.stage(s)));
    if (peaks) peaks->push_back(plan_largest_rank(spec.stage(s)).peak_bytes);
  }
  return plan_pipeline_time(spec, stages, machine_calibration());
}

double slowest_stage_step(const PipelineTime& t) {
  double most = 0;
  for (int s = 0; s < t.stages; ++s) most = std::max(most, t.stage_step(s));
  return most;
}

// A large vocabulary makes the LM head weigh about 30 blocks (32000 x 96 against a block's
// 96 x 1056 weights): the auto cut gives the last stage fewer blocks than the first, and no cut
// of the 8 blocks has a faster slowest stage.
TEST(PipelineTime, TheAutoCutGivesAHeavyHeadFewerBlocksAndIsTheFastest) {
  RunSpec spec = resolve_run(pipe_config(8, 2, 32000));
  ASSERT_TRUE(spec.pp_layers_auto);
  const StageSplit split = balance_stages(spec);
  ASSERT_EQ(split.stages.size(), 2u);
  EXPECT_FALSE(split.by_memory);
  EXPECT_LT(split.stages[1].blocks(), split.stages[0].blocks()) << split.why;
  EXPECT_NE(split.why.find("--pp-layers auto"), std::string::npos);
  spec.pipeline = split.stages;
  const double best = slowest_stage_step(planned(spec));
  for (int first = 1; first < 8; ++first) {
    spec.pipeline = split_stages(fmt::format("{},{}", first, 8 - first), 8, 2);
    EXPECT_LE(best, slowest_stage_step(planned(spec)) * (1 + 1e-12)) << first;
  }
  // Three stages: the last (the head) still the fewest.
  const StageSplit three = balance_stages(resolve_run(pipe_config(9, 3, 32000)));
  EXPECT_LE(three.stages[2].blocks(), three.stages[1].blocks()) << three.why;
  EXPECT_LE(three.stages[2].blocks(), three.stages[0].blocks()) << three.why;
}

// Interleaved (Note [Pipeline parallel], "Interleaved"): auto balances the P x V chunks, each
// priced as a stage of its own, so the head's chunk (the last virtual stage) gets fewer blocks
// than the even split's; the cut is the P x V chunks' and keeps checkpoint segments whole.
TEST(PipelineTime, TheInterleavedAutoCutBalancesTheChunks) {
  TrainConfig c = pipe_config(8, 2, 32000);
  c.pp_schedule = "interleaved";
  c.pp_virtual = 2;
  const RunSpec spec = resolve_run(c);
  ASSERT_TRUE(spec.pp_layers_auto);
  const StageSplit split = balance_stages(spec);
  ASSERT_EQ(split.stages.size(), 4u) << split.why;
  EXPECT_FALSE(split.by_memory);
  EXPECT_NE(split.why.find("slowest chunk"), std::string::npos) << split.why;
  int blocks = 0;
  for (const PipelineStage& s : split.stages) {
    EXPECT_GE(s.blocks(), 1) << split.why;
    blocks += s.blocks();
  }
  EXPECT_EQ(blocks, 8);
  for (size_t v = 0; v + 1 < split.stages.size(); ++v)
    EXPECT_LT(split.stages[3].blocks(), split.stages[v].blocks()) << split.why;
  c.ckpt = "every:2";
  for (const PipelineStage& s : balance_stages(resolve_run(c)).stages)
    EXPECT_EQ(s.first % 2, 0) << describe_stages(balance_stages(resolve_run(c)).stages);
}

// Cuts lie between checkpoint segments: every:2 over 8 blocks cuts only at even blocks.
TEST(PipelineTime, TheAutoCutKeepsCheckpointSegmentsWhole) {
  TrainConfig c = pipe_config(8, 2, 32000);
  c.ckpt = "every:2";
  const StageSplit split = balance_stages(resolve_run(c));
  EXPECT_EQ(split.stages[0].last % 2, 0) << split.why;
}

// Where the time-balanced cut's largest stage does not fit --mem-limit, the cut with the least
// largest peak instead, and it says why.
TEST(PipelineTime, TheAutoCutBalancesMemoryWhereTheLimitBinds) {
  RunSpec spec = resolve_run(pipe_config(8, 2, 32000));
  const StageSplit by_time = balance_stages(spec);
  spec.pipeline = by_time.stages;
  std::vector<size_t> peaks;
  planned(spec, &peaks);
  const size_t largest = *std::max_element(peaks.begin(), peaks.end());
  spec.mem_limit = largest - 1;
  const StageSplit split = balance_stages(spec);
  EXPECT_TRUE(split.by_memory);
  EXPECT_NE(split.why.find("--mem-limit"), std::string::npos) << split.why;
  spec.pipeline = split.stages;
  std::vector<size_t> balanced;
  planned(spec, &balanced);
  EXPECT_LT(*std::max_element(balanced.begin(), balanced.end()), largest) << split.why;
  // A limit the time-balanced cut fits keeps it.
  spec.mem_limit = largest;
  EXPECT_FALSE(balance_stages(spec).by_memory);
}

}  // namespace
}  // namespace memfit
