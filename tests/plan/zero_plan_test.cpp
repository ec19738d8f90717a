// The plan per rank under ZeRO (Note [ZeRO]): the model state categories follow the stages'
// arithmetic (bf16 working weights, f32 gradients, FP32 master weights and AdamW's two moments:
// 18Ψ at stage 0; 2Ψ + 4Ψ + 12Ψ/N at stage 1; 2Ψ + 16Ψ/N at stage 2, plus its gradient unit
// buffers; 18Ψ/N at stage 3, plus its gather buffers), the ranks' shards tile the master weights,
// the gradients and the optimizer state, and one rank at any stage is stage 0. The measured
// side is tests/cli/zero_test.cpp (under mpirun).
#include <gtest/gtest.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/dist/grad_sync.h"
#include "memfit/dist/zero/unit_grads.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/optimizer.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/state/shard.h"

namespace memfit {
namespace {

RunSpec spec(int world, int zero, int prefetch_depth = 1, int64_t persist_threshold = 0,
             const char* grad_dtype = "fp32") {
  TrainConfig c;
  c.grad_dtype = grad_dtype;
  c.model = "gpt2-tiny";
  c.seq_len = 32;
  c.batch = 1;
  c.steps = 0;
  c.precision = "bf16";
  c.ranks = world;
  c.zero = zero;
  c.prefetch_depth = prefetch_depth;
  c.persist_threshold = persist_threshold;
  return resolve_run(c);
}

size_t at(const PlanReport& p, Category c) { return p.by_category[static_cast<size_t>(c)]; }

// (Two micro-batches a step: with one, stages 0-1 keep the whole f32 slab in the activations
// arena, Note [Gradients by lifetime], which GradientsShareTheArenaAtStagesZeroAndOne checks.)
RunSpec accumulating(int world, int zero) {
  RunSpec s = spec(world, zero);
  s.grad_accum = 2;
  return s;
}

TEST(ZeroPlan, ModelStateFollowsTheStages) {
  const int N = 8;
  const PlanReport p0 = plan_memory(accumulating(N, 0));
  const double psi = double(ParamLayout(p0.model).total());
  EXPECT_EQ(at(p0, Category::params), MemoryPool::round_up(size_t(psi) * 2));
  EXPECT_EQ(at(p0, Category::master), MemoryPool::round_up(size_t(psi) * 4));
  EXPECT_EQ(at(p0, Category::grads), MemoryPool::round_up(size_t(psi) * 4));
  EXPECT_EQ(at(p0, Category::optimizer), 2 * MemoryPool::round_up(size_t(psi) * 4));
  for (int zero : {1, 2}) {
    size_t master = 0, grads = 0, optimizer = 0;
    const RunSpec s = accumulating(N, zero);
    const ParamLayout layout(p0.model);
    const std::vector<ElementRange> shards = shard_ranges(layout, s.optim, N);
    for (int r = 0; r < N; ++r) {
      const PlanReport p = plan_memory(s, r);
      EXPECT_EQ(at(p, Category::params), at(p0, Category::params));
      // 4Ψ/N and 8Ψ/N, to the cut granule and the pool's 64-byte rounding.
      EXPECT_NEAR(double(at(p, Category::master)), 4 * psi / N, 4 * 64 + 64);
      EXPECT_NEAR(double(at(p, Category::optimizer)), 8 * psi / N, 8 * 64 + 128);
      if (zero == 1) {
        EXPECT_EQ(at(p, Category::grads), at(p0, Category::grads));  // all-reduced: whole
      } else {
        // Stage 2: the shard's sums, and the unit buffers with their receive ring in comm.
        EXPECT_NEAR(double(at(p, Category::grads)), 4 * psi / N, 4 * 64 + 64);
        EXPECT_EQ(at(p, Category::comm),
                  UnitGrads::comm_bytes(layout, s.bucket_bytes, shards, r, false));
      }
      master += at(p, Category::master);
      grads += at(p, Category::grads);
      optimizer += at(p, Category::optimizer);
    }
    // The shards tile the slabs: together the whole, to the rounding of each piece.
    EXPECT_NEAR(double(master), double(at(p0, Category::master)), 64.0 * N);
    EXPECT_NEAR(double(optimizer), double(at(p0, Category::optimizer)), 128.0 * N);
    if (zero == 2) { EXPECT_NEAR(double(grads), double(at(p0, Category::grads)), 64.0 * N); }
  }
}

// One micro-batch a step: stages 0-1 hold the whole f32 slab, which the activations arena takes
// in (grads 0, the arena at least the slab); stages 2-3 reduce per unit and keep their shard.
TEST(ZeroPlan, GradientsShareTheArenaAtStagesZeroAndOne) {
  const int N = 8;
  for (int zero = 0; zero <= 3; ++zero) {
    const RunSpec one = spec(N, zero), two = accumulating(N, zero);
    EXPECT_EQ(one.grads_share_arena(), zero <= 1) << zero;
    EXPECT_FALSE(two.grads_share_arena()) << zero;
    const PlanReport p1 = plan_memory(one), p2 = plan_memory(two);
    if (zero >= 2) {
      EXPECT_EQ(at(p1, Category::grads), at(p2, Category::grads));
      EXPECT_EQ(at(p1, Category::activations), at(p2, Category::activations));
      continue;
    }
    EXPECT_EQ(at(p1, Category::grads), 0u) << zero;
    EXPECT_GE(at(p1, Category::activations), at(p2, Category::grads)) << zero;
    EXPECT_LT(p1.peak_bytes, p2.peak_bytes) << zero;
  }
}

TEST(ZeroPlan, OneRankIsStageZero) {
  const PlanReport p0 = plan_memory(spec(1, 0));
  for (int zero : {1, 2, 3}) {
    const PlanReport p = plan_memory(spec(1, zero));
    EXPECT_EQ(p.peak_bytes, p0.peak_bytes) << "--zero " << zero;
    EXPECT_EQ(p.by_category, p0.by_category) << "--zero " << zero;
  }
}

// Stage 3: each rank's working weights are its shard (2Ψ/N), and comm holds, beside stage 2's
// receive ring, the persistent units (the embeddings and the tail) and prefetch_depth + 1 block
// slots; blocks under --persist-threshold move from the ring to the persistent buffer.
TEST(ZeroPlan, StageThreeShardsTheWorkingWeightsAndCountsTheGatherBuffers) {
  const int N = 8;
  const PlanReport p0 = plan_memory(spec(N, 0));
  const ParamLayout layout(p0.model);
  const double psi = double(layout.total());
  const std::vector<ElementRange> units = unit_ranges(layout);
  const int64_t edges = units.front().size() + units.back().size(), block = units[1].size();
  size_t params = 0;
  for (int r = 0; r < N; ++r) {
    const PlanReport p2 = plan_memory(spec(N, 2), r), p3 = plan_memory(spec(N, 3), r);
    EXPECT_NEAR(double(at(p3, Category::params)), 2 * psi / N, 2 * 64 + 64);
    params += at(p3, Category::params);
    for (Category c : {Category::master, Category::grads, Category::optimizer})
      EXPECT_EQ(at(p3, c), at(p2, c)) << category_name(c);
    for (int depth : {0, 1, 3}) {
      const PlanReport p = plan_memory(spec(N, 3, depth), r);
      const size_t slots = static_cast<size_t>((block + 31) / 32 * 32 * (depth + 1) * 2);
      EXPECT_EQ(at(p, Category::comm), at(p2, Category::comm) +
                                           MemoryPool::round_up(size_t(edges) * 2) +
                                           MemoryPool::round_up(slots))
          << "depth " << depth << ", rank " << r;
    }
    // Every block kept whole: the persistent buffer is the whole layout, no ring.
    const PlanReport all = plan_memory(spec(N, 3, 1, block + 1), r);
    EXPECT_EQ(at(all, Category::comm),
              at(p2, Category::comm) + MemoryPool::round_up(size_t(psi) * 2));
  }
  EXPECT_NEAR(double(params), double(at(p0, Category::params)), 64.0 * N);
}

TEST(ZeroPlan, BadStagesAndStageThreeOptionsAreRefused) {
  EXPECT_THROW(spec(2, 4), ConfigError);
  EXPECT_THROW(spec(2, 3, -1), ConfigError);
  EXPECT_THROW(spec(2, 3, 1, -1), ConfigError);
}

// --grad-dtype bf16 (Note [Gradients in bf16]): each rank's gradient sums are 2 bytes a
// parameter of the range it keeps (the whole layout at stages 0-1 and in one process, its shard
// at stages 2-3) where f32 keeps 4, to the pool's rounding; the reduction's bytes a step halve
// exactly; every other category of the model state is f32's; the update's widening buffer is
// staging; and the search is never asked to change it.
TEST(ZeroPlan, Bf16GradientsHalveTheGradientsAndTheirReduction) {
  for (int world : {1, 8}) {
    for (int zero = 0; zero <= 3; ++zero) {
      const RunSpec s32 = spec(world, zero), s16 = spec(world, zero, 1, 0, "bf16");
      EXPECT_EQ(s16.grad_dtype, DType::bf16);
      const ParamLayout layout(plan_memory(s32).model);
      const std::vector<ElementRange> shards =
          world > 1 ? shard_ranges(layout, s32.optim, world)
                    : std::vector<ElementRange>{{0, layout.total()}};
      for (int r : {0, world - 1}) {
        const PlanReport p32 = plan_memory(s32, r), p16 = plan_memory(s16, r);
        const int64_t kept =
            world > 1 && zero >= 2 ? shards[size_t(r)].size() : layout.total();
        // (A whole f32 slab, in one process or at stages 0-1, lies in the activations arena:
        // Note [Gradients by lifetime].)
        EXPECT_EQ(at(p32, Category::grads),
                  s32.grads_share_arena() ? 0 : MemoryPool::round_up(size_t(kept) * 4));
        EXPECT_EQ(s32.grads_share_arena(), world == 1 || zero <= 1);
        EXPECT_EQ(at(p16, Category::grads), MemoryPool::round_up(size_t(kept) * 2))
            << "W " << world << " stage " << zero << " rank " << r;
        for (Category c : {Category::params, Category::master, Category::optimizer})
          EXPECT_EQ(at(p16, c), at(p32, c));
        if (world == 1 || zero < 3) {  // (stage 3 adds its gather buffers)
          EXPECT_EQ(at(p16, Category::comm),
                  UnitGrads::comm_bytes(layout, s16.bucket_bytes, shards, r,
                                        /*whole=*/world == 1 || zero < 2, DType::bf16));
        }
        EXPECT_EQ(at(p16, Category::staging) - at(p32, Category::staging),
                  MemoryPool::round_up(size_t(grad_widen_elements(s16.optim, layout)) * 4));
        EXPECT_EQ(2 * p16.comm_per_step.all_reduce, p32.comm_per_step.all_reduce);
        EXPECT_EQ(2 * p16.comm_per_step.reduce_scatter, p32.comm_per_step.reduce_scatter);
        EXPECT_EQ(p16.comm_per_step.all_gather, p32.comm_per_step.all_gather);
        if (world > 1) {
          EXPECT_GT(p32.comm_per_step.all_reduce + p32.comm_per_step.reduce_scatter, 0);
        }
      }
    }
  }
}

}  // namespace
}  // namespace memfit
