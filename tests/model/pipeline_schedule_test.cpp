// The pipeline schedules (model/pipeline_schedule.h): their order, the micro-batches each stage
// holds at once (1F1B's stage s at most P - s, GPipe all m), that every stage runs each
// micro-batch's backwards in order (so gradients sum as one process's), and that the stages'
// lists run to completion against each other.
#include "memfit/model/pipeline_schedule.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "memfit/core/error.h"

namespace memfit {
namespace {

using K = PipeOp::Kind;
constexpr PipeOp F(int m) { return {K::forward, m}; }
constexpr PipeOp B(int m) { return {K::backward, m}; }

TEST(PipelineSchedule, OneFOneBFillsThePipeThenAlternatesThenDrains) {
  // 4 stages, 6 micro-batches: stage 0 runs 3 forwards first, the last stage none.
  EXPECT_EQ(pipe_stage_ops(PipeSchedule::one_f_one_b, 0, 4, 6),
            (std::vector<PipeOp>{F(0), F(1), F(2), F(3), B(0), F(4), B(1), F(5), B(2), B(3),
                                 B(4), B(5)}));
  EXPECT_EQ(pipe_stage_ops(PipeSchedule::one_f_one_b, 3, 4, 6),
            (std::vector<PipeOp>{F(0), B(0), F(1), B(1), F(2), B(2), F(3), B(3), F(4), B(4),
                                 F(5), B(5)}));
  // Fewer micro-batches than stages: every forward, then every backward.
  EXPECT_EQ(pipe_stage_ops(PipeSchedule::one_f_one_b, 0, 4, 2),
            (std::vector<PipeOp>{F(0), F(1), B(0), B(1)}));
}

TEST(PipelineSchedule, GPipeRunsEveryForwardThenEveryBackward) {
  EXPECT_EQ(pipe_stage_ops(PipeSchedule::gpipe, 1, 2, 3),
            (std::vector<PipeOp>{F(0), F(1), F(2), B(0), B(1), B(2)}));
}

TEST(PipelineSchedule, OneFOneBHoldsPMinusSMicroBatchesAndGPipeHoldsThemAll) {
  for (int P = 1; P <= 6; ++P)
    for (int m = 1; m <= 9; ++m)
      for (int s = 0; s < P; ++s) {
        EXPECT_EQ(pipe_in_flight(pipe_stage_ops(PipeSchedule::one_f_one_b, s, P, m)),
                  std::min(P - s, m))
            << "stage " << s << " of " << P << ", m " << m;
        EXPECT_EQ(pipe_in_flight(pipe_stage_ops(PipeSchedule::gpipe, s, P, m)), m);
      }
}

TEST(PipelineSchedule, EveryStageRunsEachMicroBatchOnceAndItsBackwardsInOrder) {
  for (PipeSchedule sched : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b})
    for (int P = 1; P <= 5; ++P)
      for (int m = 1; m <= 8; ++m)
        for (int s = 0; s < P; ++s) {
          const std::vector<PipeOp> ops = pipe_stage_ops(sched, s, P, m);
          ASSERT_EQ(static_cast<int>(ops.size()), 2 * m);
          int f = 0, b = 0;
          for (const PipeOp& op : ops) {
            if (op.kind == K::forward) {
              EXPECT_EQ(op.micro, f++);
            } else {
              EXPECT_EQ(op.micro, b++);
              EXPECT_LT(op.micro, f);  // its forward came first
            }
          }
        }
}

TEST(PipelineSchedule, TheStagesListsRunToCompletionAgainstEachOther) {
  for (PipeSchedule sched : {PipeSchedule::gpipe, PipeSchedule::one_f_one_b})
    for (int P = 1; P <= 6; ++P)
      for (int m = 1; m <= 9; ++m) {
        std::vector<std::vector<PipeOp>> all;
        for (int s = 0; s < P; ++s) all.push_back(pipe_stage_ops(sched, s, P, m));
        EXPECT_TRUE(pipe_runs_to_completion(all)) << pipe_schedule_name(sched) << " P " << P;
      }
  // A hand-written order that cannot: stage 1 wants micro-batch 1 first, which stage 0 sends
  // only after micro-batch 0's backward, which waits for stage 1's.
  const std::vector<std::vector<PipeOp>> stuck = {{F(0), B(0), F(1), B(1)},
                                                  {F(1), B(1), F(0), B(0)}};
  EXPECT_FALSE(pipe_runs_to_completion(stuck));
}

TEST(PipelineSchedule, NamesParseAndInterleavedIsRefusedSayingWhy) {
  EXPECT_EQ(parse_pipe_schedule("gpipe"), PipeSchedule::gpipe);
  EXPECT_EQ(parse_pipe_schedule("1f1b"), PipeSchedule::one_f_one_b);
  EXPECT_EQ(pipe_schedule_name(PipeSchedule::one_f_one_b), "1f1b");
  try {
    parse_pipe_schedule("interleaved");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--pp-virtual"), std::string::npos);
  }
  EXPECT_THROW(parse_pipe_schedule("zb"), ConfigError);
}

}  // namespace
}  // namespace memfit
