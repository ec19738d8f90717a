// Megatron's interleaved 1F1B (model/pipeline_interleaved.h): its order (Megatron's numbering,
// warm-up and all-warm-up at m == P), that every chunk runs each micro-batch's forward and
// backward once and both in micro-batch order (so each parameter's gradient is one process's
// sum), the micro-batches in flight (warm-up + 1), completion under the runner's waits (a
// broken order is caught), and the refusals naming the values.
#include "memfit/model/pipeline_interleaved.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "memfit/core/error.h"

namespace memfit {
namespace {

using K = PipeOp::Kind;
constexpr ChunkOp F(int c, int m) { return {K::forward, c, m}; }
constexpr ChunkOp B(int c, int m) { return {K::backward, c, m}; }

TEST(PipelineInterleaved, RunsMegatronsOrder) {
  // 2 ranks, 2 chunks, 4 micro-batches: rank 0 warms up with (2 - 0 - 1) x 2 + (2 - 1) x 2 = 4
  // forwards (micro-batches 0-1 through chunk 0, then chunk 1), rank 1 with 2; the backwards
  // take each group through the chunks in reverse.
  EXPECT_EQ(interleaved_stage_ops(0, 2, 2, 4),
            (std::vector<ChunkOp>{F(0, 0), F(0, 1), F(1, 0), F(1, 1), F(0, 2), B(1, 0), F(0, 3),
                                  B(1, 1), F(1, 2), B(0, 0), F(1, 3), B(0, 1), B(1, 2), B(1, 3),
                                  B(0, 2), B(0, 3)}));
  EXPECT_EQ(interleaved_stage_ops(1, 2, 2, 4),
            (std::vector<ChunkOp>{F(0, 0), F(0, 1), F(1, 0), B(1, 0), F(1, 1), B(1, 1), F(0, 2),
                                  B(0, 0), F(0, 3), B(0, 1), F(1, 2), B(1, 2), F(1, 3), B(1, 3),
                                  B(0, 2), B(0, 3)}));
  // m == P: every forward first (Megatron's all-warm-up).
  EXPECT_EQ(interleaved_stage_ops(1, 2, 2, 2),
            (std::vector<ChunkOp>{F(0, 0), F(0, 1), F(1, 0), F(1, 1), B(1, 0), B(1, 1), B(0, 0),
                                  B(0, 1)}));
  // One chunk: 1F1B.
  std::vector<ChunkOp> one;
  for (const PipeOp& op : pipe_stage_ops(PipeSchedule::one_f_one_b, 1, 3, 6))
    one.push_back({op.kind, 0, op.micro});
  EXPECT_EQ(interleaved_stage_ops(1, 3, 1, 6), one);
  EXPECT_EQ(chunk_stage_ops(PipeSchedule::gpipe, 1, 0, 2, 2),
            (std::vector<ChunkOp>{F(0, 0), F(0, 1), B(0, 0), B(0, 1)}));
}

TEST(PipelineInterleaved, EveryChunkRunsItsMicroBatchesOnceAndInOrderAndTheListsComplete) {
  for (int P = 2; P <= 5; ++P)
    for (int V = 2; V <= 4; ++V)
      for (int m = P; m <= 4 * P; m += P) {
        std::vector<std::vector<ChunkOp>> ranks;
        for (int r = 0; r < P; ++r) {
          const std::vector<ChunkOp> ops = interleaved_stage_ops(r, P, V, m);
          ASSERT_EQ(static_cast<int>(ops.size()), 2 * m * V);
          for (int c = 0; c < V; ++c) {
            int f = 0, b = 0;
            for (const ChunkOp& op : ops) {
              if (op.chunk != c) continue;
              if (op.kind == K::forward) {
                EXPECT_EQ(op.micro, f++);
              } else {
                EXPECT_LT(op.micro, f) << "a backward before its forward";
                EXPECT_EQ(op.micro, b++) << "P " << P << " V " << V << " m " << m;
              }
            }
            EXPECT_EQ(f, m);
            EXPECT_EQ(b, m);
          }
          // In flight: the warm-up's forwards and the first steady forward (every forward at
          // m == P).
          const int warmup = m == P ? m * V : std::min((P - r - 1) * 2 + (V - 1) * P, m * V);
          EXPECT_EQ(chunk_in_flight(ops, [](int) { return true; }), std::min(warmup + 1, m * V))
              << "rank " << r << " of " << P << ", V " << V << ", m " << m;
          ranks.push_back(ops);
        }
        EXPECT_TRUE(chunk_runs_to_completion(ranks, V)) << "P " << P << " V " << V << " m " << m;
      }
}

TEST(PipelineInterleaved, CountsTheInputsAndSendsARankKeeps) {
  // 2 ranks, 2 chunks, 4 micro-batches. Rank 0's chunk 0 is virtual stage 0 (no input), rank
  // 1's chunk 1 the last (no send).
  const std::vector<ChunkOp> r0 = interleaved_stage_ops(0, 2, 2, 4);
  const std::vector<ChunkOp> r1 = interleaved_stage_ops(1, 2, 2, 4);
  EXPECT_EQ(chunk_in_flight(r0, [](int c) { return c > 0; }), 2);
  EXPECT_EQ(chunk_in_flight(r0, [](int) { return true; }), 5);
  EXPECT_EQ(chunk_in_flight(r1, [](int) { return true; }), 3);
  EXPECT_EQ(chunk_in_flight(r1, [](int c) { return c < 1; }), 3);
  // 1F1B over the same 4 stages' blocks (pp 2, one chunk a rank) keeps 2 and 1: interleaving
  // keeps more in flight, each a chunk's input (half a stage's blocks behind it).
  EXPECT_EQ(pipe_in_flight(pipe_stage_ops(PipeSchedule::one_f_one_b, 0, 2, 4)), 2);
}

TEST(PipelineInterleaved, ABrokenOrderIsCaught) {
  std::vector<std::vector<ChunkOp>> ranks = {interleaved_stage_ops(0, 2, 2, 4),
                                             interleaved_stage_ops(1, 2, 2, 4)};
  ASSERT_TRUE(chunk_runs_to_completion(ranks, 2));
  // Rank 1 runs chunk 0's backward of micro-batch 0 before chunk 1's: it waits for rank 0's
  // chunk 1 backward, which waits for rank 1's chunk 1.
  auto& r1 = ranks[1];
  const auto b10 = std::find(r1.begin(), r1.end(), B(1, 0));
  const auto b00 = std::find(r1.begin(), r1.end(), B(0, 0));
  std::iter_swap(b10, b00);
  EXPECT_FALSE(chunk_runs_to_completion(ranks, 2));
}

TEST(PipelineInterleaved, RefusalsNameTheValues) {
  auto message = [](int P, int V, int m) {
    try {
      check_interleaved(P, V, m);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(message(2, 2, 3).find("--grad-accum 3 is not a multiple of --pp 2"),
            std::string::npos);
  EXPECT_NE(message(2, 1, 4).find("--pp-virtual 2 or more"), std::string::npos);
  EXPECT_NE(message(1, 2, 4).find("--pp 2 or more, got 1"), std::string::npos);
  EXPECT_EQ(message(2, 2, 4), "");
  EXPECT_THROW(interleaved_stage_ops(0, 4, 2, 6), ConfigError);
}

}  // namespace
}  // namespace memfit
