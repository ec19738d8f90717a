// Shard and unit ranges (Note [Model state]): shards tile the layout, cut where every state
// allows, balanced to within one cut granule; units are the embeddings, each block and the
// tail, each holding exactly its parameters.
#include "memfit/state/shard.h"

#include <gtest/gtest.h>

#include "memfit/model/model_config.h"
#include "memfit/optim/optimizer.h"

namespace memfit {
namespace {

ModelConfig config(const char* preset) {
  ModelConfig c = ModelConfig::preset(preset);
  c.finalize();
  return c;
}

TEST(ShardRanges, TileTheLayoutAtCutsTheStateAllows) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny", "gpt2"}) {
    const ModelConfig mc = config(preset);
    const ParamLayout layout(mc);
    for (const char* name : {"adamw", "adamw8bit", "lion8bit", "adam-mini", "sgd"}) {
      OptimConfig oc;
      oc.name = name;
      oc.n_head = mc.n_head;
      auto opt = make_optimizer(oc, layout, nullptr);
      for (int world : {1, 2, 3, 4, 8}) {
        const auto ranges = shard_ranges(layout, oc, world);
        ASSERT_EQ(static_cast<int>(ranges.size()), world);
        int64_t at = 0, largest = 0;
        for (const ElementRange& r : ranges) {
          EXPECT_EQ(r.begin, at) << preset << " " << name << " " << world;
          EXPECT_EQ(opt->next_cut(r.begin), r.begin) << preset << " " << name;
          at = r.end;
          largest = std::max(largest, r.size());
        }
        EXPECT_EQ(at, layout.total());
        // Balanced: the largest is the even share plus at most one granule (a row of the
        // embedding for Adam-mini, the biggest block boundary step).
        const int64_t even = layout.total() / world;
        EXPECT_LE(largest - even, int64_t{mc.d_model} * mc.d_model + 256) << preset << " " << name;
      }
    }
  }
}

// adamw4bit's rank-1 second moment spans a matrix: shards hold whole matrices, and are as even
// as that allows (the largest over the even share by at most the largest matrix).
TEST(ShardRanges, Rank1StateCutsOnlyBetweenMatrices) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    const ModelConfig mc = config(preset);
    const ParamLayout layout(mc);
    OptimConfig oc;
    oc.name = "adamw4bit";
    int64_t biggest = 0;
    for (const ParamInfo& p : layout.params()) biggest = std::max(biggest, p.numel);
    for (int world : {2, 3, 4}) {
      int64_t at = 0, largest = 0;
      for (const ElementRange& r : shard_ranges(layout, oc, world)) {
        EXPECT_EQ(r.begin, at);
        at = r.end;
        largest = std::max(largest, r.size());
        for (const ParamInfo& p : layout.params()) {
          if (p.numel >= 4096 && p.shape.rank() == 2) {
            EXPECT_FALSE(r.begin > p.offset && r.begin < p.offset + p.numel)
                << preset << " " << p.name << " cut at " << r.begin;
          }
        }
      }
      EXPECT_EQ(at, layout.total());
      EXPECT_LE(largest - layout.total() / world, biggest) << preset << " " << world;
    }
  }
}

TEST(ShardRanges, ManyRanksOnATinyModelLeaveSomeEmpty) {
  const ModelConfig mc = config("gpt2-tiny");
  const ParamLayout layout(mc);
  OptimConfig oc;
  const auto ranges = shard_ranges(layout, oc, 100000);
  int64_t covered = 0;
  for (const ElementRange& r : ranges) covered += r.size();
  EXPECT_EQ(covered, layout.total());
  EXPECT_THROW(shard_ranges(layout, oc, 0), Error);
}

TEST(UnitRanges, EmbeddingsEachBlockAndTheTail) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    const ModelConfig mc = config(preset);
    const ParamLayout layout(mc);
    const auto units = unit_ranges(layout);
    ASSERT_EQ(static_cast<int>(units.size()), mc.n_layer + 2) << preset;
    EXPECT_EQ(units.front().begin, 0);
    EXPECT_EQ(units.back().end, layout.total());
    for (size_t u = 1; u < units.size(); ++u) EXPECT_EQ(units[u].begin, units[u - 1].end);
    for (const ParamInfo& p : layout.params()) {
      const ElementRange pr{p.offset, p.offset + p.numel};
      if (p.layer >= 0) {
        EXPECT_TRUE(block_range(layout, p.layer).contains(pr)) << p.name;
      } else {
        EXPECT_TRUE(units.front().contains(pr) || units.back().contains(pr)) << p.name;
      }
    }
    EXPECT_THROW(block_range(layout, mc.n_layer), Error);
  }
}

}  // namespace
}  // namespace memfit
