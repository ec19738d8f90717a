// Which unit of a layout holds what (model/unit_map.h): the whole model's units are the
// embeddings, the blocks and the tail (unit 1 + l is block l); a pipeline stage's are its own
// blocks, the embeddings on the first stage, the tail on the last and a tied last stage's copy
// of the table after it. What ZeRO's per-unit gradients and stage 3's gathers index by.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/pipeline_stages.h"
#include "memfit/model/stage_offsets.h"
#include "memfit/model/unit_map.h"

#include "tiny_llama.h"

namespace memfit {
namespace {

ModelConfig llama(int n_layer, bool tied) { return test::tiny_llama(n_layer, tied); }

TEST(UnitMap, TheWholeModelsBlockLIsUnitOnePlusL) {
  for (const bool tied : {false, true}) {
    const ParamLayout layout(llama(3, tied));
    const UnitMap m = unit_map(layout);
    ASSERT_EQ(m.units.size(), 5u);
    EXPECT_EQ(m.embeddings, 0);
    EXPECT_EQ(m.tail, 4);
    EXPECT_EQ(m.copy, -1);
    EXPECT_EQ(m.first_layer, 0);
    EXPECT_EQ(m.blocks, 3);
    for (int l = 0; l < 3; ++l) {
      EXPECT_EQ(m.block_unit(l), size_t(1 + l));
      EXPECT_EQ(m.layer[1 + l], l);
      EXPECT_EQ(block_range(layout, l), m.units[1 + l]);
    }
    EXPECT_TRUE(m.edge(0) && m.edge(4) && !m.edge(1));
    EXPECT_THROW(m.block_unit(3), Error);
    EXPECT_THROW(block_range(layout, 3), Error);
  }
}

TEST(UnitMap, AStagesUnitsAreItsOwnBlocksAndEdges) {
  for (const bool tied : {false, true}) {
    const ModelConfig c = llama(5, tied);
    const std::vector<PipelineStage> stages = split_stages("2,1,2", c.n_layer, 3);
    for (const PipelineStage& s : stages) {
      ModelConfig sc = c;
      sc.set_pipeline_stage(s);
      const ParamLayout layout(sc);
      const UnitMap m = unit_map(layout);
      const std::string what = fmt::format("tied {}, stage {}", tied, s.index);
      const bool copy = tied && s.has_head();
      EXPECT_EQ(m.units.size(),
                size_t(s.blocks() + s.has_embeddings() + s.has_head() + copy)) << what;
      EXPECT_EQ(m.embeddings, s.has_embeddings() ? 0 : -1) << what;
      EXPECT_EQ(m.first_block, s.has_embeddings() ? 1 : 0) << what;
      EXPECT_EQ(m.first_layer, s.first) << what;
      EXPECT_EQ(m.blocks, s.blocks()) << what;
      EXPECT_EQ(m.tail, s.has_head() ? m.first_block + s.blocks() : -1) << what;
      EXPECT_EQ(m.copy, copy ? m.tail + 1 : -1) << what;
      if (copy) {
        EXPECT_EQ(m.units[static_cast<size_t>(m.copy)], tied_table_copy(layout)) << what;
      }
      for (int l = s.first; l < s.last; ++l) {
        const size_t u = m.block_unit(l);
        EXPECT_EQ(m.layer[u], l) << what;
        EXPECT_EQ(block_range(layout, l), m.units[u]) << what;
        for (const ParamInfo& p : layout.params()) {
          if (p.layer == l) {
            EXPECT_TRUE(m.units[u].contains({p.offset, p.offset + p.numel}));
          }
        }
      }
      // Another stage's block is not in this layout.
      EXPECT_FALSE(m.has_block(s.first - 1));
      EXPECT_FALSE(m.has_block(s.last));
      EXPECT_THROW(block_range(layout, s.last), Error) << what;
    }
  }
}

}  // namespace
}  // namespace memfit
