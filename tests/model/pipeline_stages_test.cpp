// The pipeline's cut into stages (model/pipeline_stages.h): the even split by block count, the
// explicit --pp-layers list, and the layouts refused with the values at fault.
#include "memfit/model/pipeline_stages.h"

#include <gtest/gtest.h>

#include "memfit/core/error.h"

namespace memfit {
namespace {

std::vector<int> counts(const std::vector<PipelineStage>& st) {
  std::vector<int> c;
  for (const PipelineStage& s : st) c.push_back(s.blocks());
  return c;
}

TEST(PipelineStages, AnEvenSplitIsContiguousAndCoversEveryBlockOnce) {
  for (int n = 1; n <= 13; ++n)
    for (int P = 1; P <= n; ++P) {
      const std::vector<PipelineStage> st = split_stages_evenly(n, P);
      ASSERT_EQ(static_cast<int>(st.size()), P);
      int at = 0;
      for (int s = 0; s < P; ++s) {
        EXPECT_EQ(st[s].index, s);
        EXPECT_EQ(st[s].stages, P);
        EXPECT_EQ(st[s].first, at);
        EXPECT_GE(st[s].blocks(), n / P);
        EXPECT_LE(st[s].blocks(), n / P + 1);
        EXPECT_EQ(st[s].has_embeddings(), s == 0);
        EXPECT_EQ(st[s].has_head(), s == P - 1);
        at = st[s].last;
      }
      EXPECT_EQ(at, n);
    }
}

TEST(PipelineStages, LeftoverBlocksGoToTheMiddleStagesThenTheFirstThenTheLast) {
  EXPECT_EQ(counts(split_stages_evenly(12, 4)), (std::vector<int>{3, 3, 3, 3}));
  EXPECT_EQ(counts(split_stages_evenly(10, 4)), (std::vector<int>{2, 3, 3, 2}));
  EXPECT_EQ(counts(split_stages_evenly(9, 4)), (std::vector<int>{2, 3, 2, 2}));
  EXPECT_EQ(counts(split_stages_evenly(11, 4)), (std::vector<int>{3, 3, 3, 2}));
  EXPECT_EQ(counts(split_stages_evenly(5, 2)), (std::vector<int>{3, 2}));
  EXPECT_EQ(describe_stages(split_stages_evenly(10, 4)), "0-1,2-4,5-7,8-9");
}

TEST(PipelineStages, AListGivesEachStagesBlockCount) {
  const std::vector<PipelineStage> st = split_stages("1,3", 4, 2);
  EXPECT_EQ(st[0], (PipelineStage{0, 2, 0, 1}));
  EXPECT_EQ(st[1], (PipelineStage{1, 2, 1, 4}));
  EXPECT_EQ(split_stages("auto", 10, 4), split_stages_evenly(10, 4));
}

TEST(PipelineStages, LayoutsThatDoNotTileTheBlocksAreRefusedNamingTheValues) {
  auto message = [](auto f) {
    try {
      f();
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([] { split_stages_evenly(3, 4); }).find("--pp 4 for a model of 3 blocks"),
            std::string::npos);
  EXPECT_NE(message([] { split_stages("2,3", 4, 2); }).find("2 stages of 5 blocks"),
            std::string::npos);
  EXPECT_NE(message([] { split_stages("4", 4, 2); }).find("needs 2 counts summing to 4"),
            std::string::npos);
  EXPECT_NE(message([] { split_stages("4,0", 4, 2); }).find("'0' is not a block count"),
            std::string::npos);
  EXPECT_NE(message([] { split_stages("2,x", 4, 2); }).find("'x'"), std::string::npos);
  EXPECT_THROW(split_stages("2,,2", 4, 2), ConfigError);
}

}  // namespace
}  // namespace memfit
