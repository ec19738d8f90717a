// ZeRO stage 3's gathers in one process (Note [ZeRO stage 3]): which units are kept whole, which
// gathers a step plan's phases need, and a Transformer whose working weights go through the
// gathers (over the single-process communicator, one shard of everything) computing the same
// bits as one that reads its slab, at every prefetch depth, with and without recomputation,
// holding what WeightGather::comm_bytes says. The ranks' side is tests/cli/zero_test.cpp.
#include "memfit/dist/zero/weight_gather.h"
#include "memfit/dist/zero/zero_state.h"

#include <gtest/gtest.h>

#include <cstring>

#include "memfit/model/transformer.h"
#include "memfit/state/shard.h"
#include "gpt2_test_util.h"

namespace memfit {
namespace {

using namespace gpt2_test;

TEST(WeightGather, TheEdgesAreAlwaysWholeAndBlocksUnderTheThreshold) {
  for (Family f : {Family::gpt2, Family::llama}) {
    const ParamLayout layout(odd_config(f));
    const std::vector<ElementRange> units = unit_ranges(layout);
    const GatherUnits g = gather_units(layout, 0);
    ASSERT_EQ(g.persistent.size(), units.size());
    EXPECT_TRUE(g.persistent.front());
    EXPECT_TRUE(g.persistent.back());
    for (size_t u = 1; u + 1 < units.size(); ++u) EXPECT_FALSE(g.persistent[u]);
    EXPECT_EQ(g.persistent_elements, units.front().size() + units.back().size());
    EXPECT_EQ(g.slot_elements % 32, 0);
    EXPECT_GE(g.slot_elements, units[1].size());
    EXPECT_LT(g.slot_elements, units[1].size() + 32);
    // A threshold above a block keeps every unit whole: no ring.
    const GatherUnits all = gather_units(layout, units[1].size() + 1);
    EXPECT_EQ(all.persistent_elements, layout.total());
    EXPECT_EQ(all.slot_elements, 0);
  }
}

TEST(WeightGather, GathersFollowThePhases) {
  ModelConfig c = odd_config();
  c.n_layer = 3;
  c.finalize();
  const ParamLayout layout(c);
  const GatherUnits g = gather_units(layout, 0);
  // Keeping everything: the forward's 3 blocks, then the backward's from the top, the top block
  // still in its slot (units 1..3 are blocks 0..2).
  std::vector<int> phase_event;
  const StepPlan kept = plan_step(c, 1, 8, {});
  EXPECT_EQ(gather_events(g, kept.phases, &phase_event), (std::vector<int>{1, 2, 3, 2, 1}));
  ASSERT_EQ(phase_event.size(), kept.phases.size());
  for (size_t i = 0; i < kept.phases.size(); ++i) {
    const Phase& p = kept.phases[i];
    const bool block = p.kind == PhaseKind::forward || p.kind == PhaseKind::backward;
    EXPECT_EQ(phase_event[i] >= 0, block) << p.name();
  }
  // every:2 (segments {0, 1} and {2}): block 2's recomputation and backward follow its forward
  // with only the head between (no gather); blocks 0 and 1 recomputed, block 1's backward at
  // once, block 0's gathered again.
  ActivationOptions every2;
  every2.ckpt = CheckpointPolicy::parse("every:2");
  EXPECT_EQ(gather_events(g, plan_step(c, 1, 8, every2).phases),
            (std::vector<int>{1, 2, 3, 1, 2, 1}));
  EXPECT_TRUE(gather_events(gather_units(layout, layout.total()), kept.phases).empty());
}

// One step's loss and gradients, and the logits, of a model at `depth` (-1: not sharded).
struct Result {
  float loss = 0;
  std::vector<char> grads, logits;
};

Result run(const ModelConfig& c, const ActivationOptions& act, int depth, int64_t threshold,
           MemoryPool& pool, dist::Communicator& comm) {
  const ParamLayout layout(c);
  ParamSharding s{&comm, {ElementRange{0, layout.total()}}, depth, threshold};
  Transformer gpt(c, pool, {},
                  zero_model_state(depth < 0 ? std::nullopt : std::optional(s.shards[0]), true,
                                   depth < 0 ? nullptr : &s, nullptr, nullptr));
  if (depth >= 0) {
    // The shard and the gather buffers, and nothing else, beside stage 0's.
    EXPECT_EQ(pool.bytes_current(Category::params),
              MemoryPool::round_up(size_t(layout.total()) * 4));
    EXPECT_EQ(pool.bytes_current(Category::comm),
              WeightGather::comm_bytes(layout, DType::f32, depth, threshold));
  }
  gpt.init_weights(7);
  gpt.reserve(2, 9, act);
  Batch b(pool, 2, 9, c.vocab_size, 3);
  Result r;
  for (int m = 0; m < 2; ++m) {  // two micro-batches: the second drains nothing, regathers all
    r.loss = gpt.forward(b.tokens, b.targets, true);
    gpt.backward();
  }
  gpt.forward(b.tokens, b.targets, false);  // an evaluation forward leaves prefetches in flight
  const char* g = static_cast<const char*>(gpt.grads().raw_data());
  r.grads.assign(g, g + gpt.grads().nbytes());
  Tensor logits = Tensor::empty(pool, {2, 9, c.vocab_size}, DType::f32, Category::staging, "l");
  gpt.logits(b.tokens, logits);
  const char* l = static_cast<const char*>(logits.raw_data());
  r.logits.assign(l, l + logits.nbytes());
  return r;
}

TEST(WeightGather, AShardedModelComputesTheSameBits) {
  const std::unique_ptr<dist::Communicator> comm = dist::make_single_communicator();
  for (Family f : {Family::gpt2, Family::llama}) {
    ModelConfig c = odd_config(f);
    c.n_layer = 3;
    c.finalize();
    for (const char* ckpt : {"none", "every:2"}) {
      ActivationOptions act;
      act.ckpt = CheckpointPolicy::parse(ckpt);
      MemoryPool pool;
      const Result want = run(c, act, -1, 0, pool, *comm);
      for (int depth : {0, 1, 2}) {
        MemoryPool p;
        const Result got = run(c, act, depth, 0, p, *comm);
        EXPECT_EQ(got.loss, want.loss) << ckpt << ", depth " << depth;
        EXPECT_TRUE(got.grads == want.grads) << ckpt << ", depth " << depth;
        EXPECT_TRUE(got.logits == want.logits) << ckpt << ", depth " << depth;
      }
      MemoryPool p;
      const Result whole = run(c, act, 1, int64_t{1} << 40, p, *comm);
      EXPECT_TRUE(whole.grads == want.grads) << ckpt << ", every block whole";
    }
  }
}

}  // namespace
}  // namespace memfit
