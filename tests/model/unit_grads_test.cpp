// Per-unit gradients in one process (Note [Sharded gradients]): a Transformer whose backward
// writes each unit into its own buffer and reduces it (over the single-process communicator,
// one shard of everything) computes the slab's gradients bit for bit, with and without
// recomputation, for both families (GPT-2's tied head writes the embedding gradient in the
// forward, LLaMA's untied head is the tail's); two micro-batches add the second's sums to the
// first's (LLaMA's embedding gradients sharing the tail's buffer, zeroed again for each
// micro-batch's embedding backward); it holds what UnitGrads::comm_bytes says. The ranks' side
// is tests/cli/zero_test.cpp.
#include "memfit/dist/zero/unit_grads.h"
#include "memfit/dist/zero/zero_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>

#include <fmt/format.h>

#include "memfit/model/pipeline_stages.h"
#include "memfit/model/transformer.h"
#include "memfit/model/unit_map.h"
#include "memfit/state/shard.h"
#include "gpt2_test_util.h"

namespace memfit {
namespace {

using namespace gpt2_test;

std::vector<float> copy(const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  std::memcpy(v.data(), t.raw_data(), t.nbytes());
  return v;
}

// The gradients of `micro_batches` micro-batches (batch seeds 3, 4, ...) in one step; with
// `units`, through per-unit buffers (`whole`: the accumulator is the whole layout).
std::vector<float> grads(const ModelConfig& c, const ActivationOptions& act, bool units,
                         bool whole, int micro_batches, dist::Communicator& comm) {
  MemoryPool pool;
  const ParamLayout layout(c);
  GradSharding s{&comm, {ElementRange{0, layout.total()}}, 4 * 1000, whole};
  Transformer gpt(c, pool, {},
                  zero_model_state(std::nullopt, true, nullptr, units ? &s : nullptr, nullptr));
  if (units) {  // the unit buffers and their receive ring, and nothing else, in comm
    EXPECT_EQ(pool.bytes_current(Category::comm),
              UnitGrads::comm_bytes(layout, s.bucket_bytes, s.shards, 0, whole));
  }
  gpt.init_weights(7);
  gpt.reserve(2, 9, act);
  gpt.zero_grad();
  for (int m = 0; m < micro_batches; ++m) {
    Batch b(pool, 2, 9, c.vocab_size, 3 + m);
    gpt.forward(b.tokens, b.targets, true);
    gpt.backward();
  }
  EXPECT_EQ(gpt.grad_sums_range(), (ElementRange{0, layout.total()}));
  return copy(gpt.grad_sums());
}

TEST(UnitGrads, OneMicroBatchIsTheSlabsBits) {
  const std::unique_ptr<dist::Communicator> comm = dist::make_single_communicator();
  for (Family f : {Family::gpt2, Family::llama}) {
    ModelConfig c = odd_config(f);
    c.n_layer = 3;
    c.finalize();
    for (const char* ckpt : {"none", "every:2"}) {
      ActivationOptions act;
      act.ckpt = CheckpointPolicy::parse(ckpt);
      const std::vector<float> want = grads(c, act, false, false, 1, *comm);
      for (bool whole : {false, true}) {
        const std::vector<float> got = grads(c, act, true, whole, 1, *comm);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), 4 * want.size()), 0)
            << ckpt << (whole ? ", whole" : ", shard");
      }
    }
  }
}

// Each micro-batch's gradients reduced and added to the accumulator: Σ_m (its sums), where the
// slab accumulates the backward's terms in place.
TEST(UnitGrads, MicroBatchesAddTheirSums) {
  const std::unique_ptr<dist::Communicator> comm = dist::make_single_communicator();
  for (Family f : {Family::gpt2, Family::llama}) {
    ModelConfig c = odd_config(f);
    c.n_layer = 2;
    c.finalize();
    const ActivationOptions act;
    const std::vector<float> got = grads(c, act, true, false, 2, *comm);
    // The same two micro-batches one step each, then added.
    MemoryPool pool;
    Transformer gpt(c, pool);
    gpt.init_weights(7);
    gpt.reserve(2, 9, act);
    std::vector<float> want(static_cast<size_t>(gpt.layout().total()), 0.0f);
    for (int m = 0; m < 2; ++m) {
      gpt.zero_grad();
      Batch b(pool, 2, 9, c.vocab_size, 3 + m);
      gpt.forward(b.tokens, b.targets, true);
      gpt.backward();
      const std::vector<float> g = copy(gpt.grads());
      for (size_t i = 0; i < want.size(); ++i) want[i] = m == 0 ? g[i] : want[i] + g[i];
    }
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(std::memcmp(got.data(), want.data(), 4 * want.size()), 0) << family_name(f);
  }
}

TEST(UnitGrads, TheBuffersAreTheUnitsAndTheShard) {
  for (Family f : {Family::gpt2, Family::llama}) {
    const ParamLayout layout(odd_config(f));
    const std::vector<ElementRange> units = unit_ranges(layout);
    const std::vector<ElementRange> shards = {{0, units[2].begin},
                                              {units[2].begin, layout.total()}};
    // The accumulator is the shard (or the whole layout); the pool's smallest block at least.
    EXPECT_EQ(UnitGrads::grads_bytes(layout, shards, 1, false),
              MemoryPool::round_up(size_t(shards[1].size()) * 4));
    EXPECT_EQ(UnitGrads::grads_bytes(layout, shards, 0, true),
              MemoryPool::round_up(size_t(layout.total()) * 4));
    // comm: the edges and two block slots, and a receive ring that grows with the bucket up to
    // the largest piece a rank owns.
    const size_t edges_and_ring =
        MemoryPool::round_up(size_t(units.front().size() + units.back().size() + 32) * 4);
    // LLaMA's untied head: the embeddings' gradients share the tail's buffer (the larger of
    // the two, rounded to 16 floats); GPT-2's tied head writes them in the forward.
    auto granules = [](int64_t n) { return (n + 15) / 16 * 16; };
    const int64_t emb = granules(units.front().size()), tail = granules(units.back().size());
    EXPECT_EQ(UnitGrads::shared_edges(layout), f == Family::llama);
    EXPECT_EQ(UnitGrads::edge_floats(layout),
              f == Family::llama ? std::max(emb, tail) : emb + tail);
    const size_t small = UnitGrads::comm_bytes(layout, 4 * 64, shards, 0, false);
    const size_t large = UnitGrads::comm_bytes(layout, size_t{1} << 30, shards, 0, false);
    EXPECT_GT(small, edges_and_ring);
    EXPECT_GT(large, small);
  }
  // A tied LLaMA head is the embeddings': two buffers again.
  ModelConfig tied = odd_config(Family::llama);
  tied.tie_embeddings = true;
  tied.finalize();
  const ParamLayout layout(tied);
  EXPECT_FALSE(UnitGrads::shared_edges(layout));
  const std::vector<ElementRange> units = unit_ranges(layout);
  EXPECT_GE(UnitGrads::edge_floats(layout), units.front().size() + units.back().size());
}

// A pipeline stage's layout (Note [Pipeline parallel], "ZeRO"): its blocks take the ring and
// its edge buffer holds the edge units it has (the embeddings on the first stage, the tail and
// a tied copy of the table on the last, none between; never shared), as comm_bytes counts;
// the step's parts reach its own units (the tail as n_layer, -1 at the end of every stage's
// backward), and a block of another stage is refused.
TEST(UnitGrads, AStagesBuffersAreItsOwnUnits) {
  const std::unique_ptr<dist::Communicator> comm = dist::make_single_communicator();
  auto granules = [](int64_t n) { return (n + 15) / 16 * 16; };
  for (Family f : {Family::gpt2, Family::llama}) {
    ModelConfig c = odd_config(f);
    c.n_layer = 4;
    c.finalize();
    for (const PipelineStage& s : split_stages("1,2,1", c.n_layer, 3)) {
      ModelConfig sc = c;
      sc.set_pipeline_stage(s);
      const ParamLayout layout(sc);
      const UnitMap m = unit_map(layout);
      const std::string what = fmt::format("{}, stage {}", family_name(f), s.index);
      int64_t edges = 0, slot = 0;
      for (size_t u = 0; u < m.units.size(); ++u) {
        if (m.edge(u))
          edges += granules(m.units[u].size());
        else
          slot = std::max(slot, granules(m.units[u].size()));
      }
      EXPECT_FALSE(UnitGrads::shared_edges(layout)) << what;
      EXPECT_EQ(UnitGrads::edge_floats(layout), edges) << what;
      EXPECT_EQ(edges == 0, !s.has_embeddings() && !s.has_head()) << what;
      EXPECT_EQ(UnitGrads::slot_floats(layout), slot) << what;
      MemoryPool pool;
      GradSharding g{comm.get(), {ElementRange{0, layout.total()}}, 4 * 1000, true};
      UnitGrads grads(pool, layout, g);
      EXPECT_EQ(pool.bytes_current(Category::comm),
                UnitGrads::comm_bytes(layout, g.bucket_bytes, g.shards, 0, true))
          << what;
      // The edge views are bound from the start: the tied last stage's head is its copy.
      EXPECT_EQ(grads.views().tok_emb.defined(),
                s.has_embeddings() || (c.tie_embeddings && s.has_head()))
          << what;
      EXPECT_EQ(grads.views().head.defined(), s.has_head()) << what;
      // One micro-batch's parts, as the stage's backward reports them.
      grads.zero();
      grads.begin_micro_batch();
      if (s.has_head()) grads.done(c.n_layer);
      for (int l = s.last - 1; l >= s.first; --l) {
        grads.enter_backward(l);
        EXPECT_TRUE(grads.views().blocks[static_cast<size_t>(l)].norm1_w.defined()) << what;
        grads.done(l);
      }
      grads.enter_embedding_backward();
      grads.done(-1);
      EXPECT_THROW(grads.enter_backward(s.last), Error) << what;
    }
  }
}

}  // namespace
}  // namespace memfit
