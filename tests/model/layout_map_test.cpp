// The layout map (model/layout_map.h): at every tp x pp layout, the runs each rank writes
// (first_holder_runs) cover every element of every parameter of the whole model exactly once and
// nothing else (replicated parameters and key/value heads once, --tp's vocabulary padding never,
// a tied last stage's copy of the token table never: the first stage writes the table),
// each run inside the parameter of the same name; runs_within cuts runs at a range's edges.
#include "memfit/model/layout_map.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "memfit/model/param_layout.h"
#include "memfit/model/pipeline_stages.h"

namespace memfit {
namespace {

// GPT-2 (tied) with a vocabulary --tp 2 and 4 pad beyond the whole table's padding (520: 576
// rows at tp 1, 640 and 768 at tp 2 and 4), and an untied LLaMA with 2 key/value heads (each
// replicated on 2 ranks at tp 4).
ModelConfig gpt2() {
  ModelConfig c = ModelConfig::preset("gpt2-tiny");
  c.vocab_size = 520;
  c.finalize();
  return c;
}
ModelConfig llama(int n_layer) {
  ModelConfig c = ModelConfig::preset("llama-tiny");
  c.n_layer = n_layer;
  c.finalize();
  return c;
}

// Every element of the whole layout: how many ranks' first-holder runs write it. Checks each
// run lies in one parameter of the rank's layout and the same-named one of the whole.
std::vector<int> writers(const ModelConfig& whole, int tp, int pp) {
  const ParamLayout wl(whole);
  std::vector<int> count(static_cast<size_t>(wl.total()), 0);
  const std::vector<PipelineStage> stages =
      pp > 1 ? split_stages("auto", whole.n_layer, pp) : std::vector<PipelineStage>{{}};
  for (const PipelineStage& s : stages)
    for (int t = 0; t < tp; ++t) {
      ModelConfig c = whole;
      if (tp > 1) c.set_tensor_parallel(tp);
      c.set_pipeline_stage(s);
      const ParamLayout local(c);
      for (const SliceRun& r : first_holder_runs(c, t)) {
        const ParamInfo* lp = nullptr;
        for (const ParamInfo& p : local.params())
          if (r.local >= p.offset && r.local + r.n <= p.offset + p.numel) lp = &p;
        const ParamInfo* wp = nullptr;
        for (const ParamInfo& p : wl.params())
          if (r.whole >= p.offset && r.whole + r.n <= p.offset + p.numel) wp = &p;
        EXPECT_TRUE(lp && wp && lp->name == wp->name)
            << "tp " << tp << " pp " << pp << " rank " << t << ": run " << r.local << " -> "
            << r.whole << " x " << r.n << " is not inside one parameter";
        for (int64_t i = 0; i < r.n; ++i) ++count[static_cast<size_t>(r.whole + i)];
      }
    }
  return count;
}

void expect_each_parameter_element_once(const ModelConfig& whole, int tp, int pp) {
  const std::vector<int> count = writers(whole, tp, pp);
  std::vector<int> want(count.size(), 0);
  const ParamLayout layout(whole);  // named: a temporary's params() would dangle
  for (const ParamInfo& p : layout.params())
    for (int64_t i = 0; i < p.numel; ++i) want[static_cast<size_t>(p.offset + i)] = 1;
  int64_t wrong = 0;
  for (size_t i = 0; i < count.size(); ++i) wrong += count[i] != want[i];
  EXPECT_EQ(wrong, 0) << whole.describe() << " at tp " << tp << " pp " << pp;
}

TEST(LayoutMap, EveryLayoutWritesEachParameterElementOnce) {
  for (int tp : {1, 2, 4})
    for (int pp : {1, 2}) expect_each_parameter_element_once(gpt2(), tp, pp);
  for (int tp : {1, 2, 4})
    for (int pp : {1, 2, 4}) expect_each_parameter_element_once(llama(4), tp, pp);
}

// A tied last stage's copy of the token table maps onto the table's elements (what a load
// fills it from), as the first stage's table does, tensor rank by tensor rank; the copy is
// written by the first stage alone (the test above).
TEST(LayoutMap, TheTiedCopyMapsOntoTheTable) {
  for (int tp : {1, 2}) {
    const std::vector<PipelineStage> stages = split_stages("auto", gpt2().n_layer, 2);
    for (int t = 0; t < tp; ++t) {
      std::vector<std::vector<SliceRun>> table(2);
      for (size_t s = 0; s < 2; ++s) {
        ModelConfig c = gpt2();
        if (tp > 1) c.set_tensor_parallel(tp);
        c.set_pipeline_stage(stages[s]);
        const ParamLayout local(c);
        const ParamInfo& p = s == 0 ? local.params().front() : local.params().back();
        ASSERT_EQ(p.role, ParamRole::token_embedding) << "stage " << s;
        for (const SliceRun& r : runs_within(whole_layout_runs(c, t), {p.offset, p.offset + p.numel}))
          table[s].push_back({r.local - p.offset, r.whole, r.n});
      }
      ASSERT_FALSE(table[0].empty());
      ASSERT_EQ(table[0].size(), table[1].size()) << "tp " << tp << " rank " << t;
      for (size_t i = 0; i < table[0].size(); ++i) {
        EXPECT_EQ(table[0][i].local, table[1][i].local) << "tp " << tp << " rank " << t;
        EXPECT_EQ(table[0][i].whole, table[1][i].whole) << "tp " << tp << " rank " << t;
        EXPECT_EQ(table[0][i].n, table[1][i].n) << "tp " << tp << " rank " << t;
      }
    }
  }
}

TEST(LayoutMap, TheTensorPaddingMapsNowhereAndReplicasToTheFirstHolder) {
  ModelConfig c = gpt2();
  c.set_tensor_parallel(4);
  int64_t padding = 0;
  for (int t = 0; t < 4; ++t)
    for (const SliceRun& r : whole_layout_runs(c, t))
      if (r.whole < 0) padding += r.n;
  // 768 rows at tp 4 against 576 whole: 192 rows of 96 (the tied table only).
  EXPECT_EQ(padding, 192 * 96);
  // LLaMA's key/value heads at tp 4: ranks 1 and 3 hold ranks 0's and 2's, and write none.
  ModelConfig l = llama(2);
  l.set_tensor_parallel(4);
  const ParamLayout local(l);
  for (int t = 0; t < 4; ++t) {
    int64_t kv = 0;
    for (const SliceRun& r : first_holder_runs(l, t))
      for (const ParamInfo& p : local.params())
        if ((p.role == ParamRole::attn_k_weight || p.role == ParamRole::attn_v_weight) &&
            r.local >= p.offset && r.local < p.offset + p.numel)
          kv += r.n;
    EXPECT_EQ(kv > 0, t % 2 == 0) << "rank " << t;
  }
}

TEST(LayoutMap, RunsWithinCutAtTheRangesEdges) {
  const std::vector<SliceRun> runs = {{0, 100, 10}, {10, -1, 5}, {16, 40, 8}};
  const std::vector<SliceRun> cut = runs_within(runs, {4, 20});
  ASSERT_EQ(cut.size(), 2u);
  EXPECT_EQ(cut[0].local, 4);
  EXPECT_EQ(cut[0].whole, 104);
  EXPECT_EQ(cut[0].n, 6);
  EXPECT_EQ(cut[1].local, 16);
  EXPECT_EQ(cut[1].whole, 40);
  EXPECT_EQ(cut[1].n, 4);
}

}  // namespace
}  // namespace memfit
