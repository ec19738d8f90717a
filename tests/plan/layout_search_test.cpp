// The layout search (plan/layout_search.h; Note [Fit a budget], "Layouts"): over 4 ranks of a
// tiny LLaMA it tries tp x pp x dp, keeps the global batch, picks a split layout where only a
// split fits (and that layout's plan fits on every rank), keeps the data-parallel layout where
// everything fits, and never chooses a combination the run refuses.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include <fmt/format.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/core/error.h"
#include "memfit/plan/layout_search.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/plan/search.h"
#include "plan_test_util.h"

namespace memfit {
namespace {

// llama-tiny at 4 blocks and 256 tokens over 4 ranks, fp32: activations large against the
// model state, so splitting the layers (--tp --sp) or the blocks (--pp) is what shrinks a rank.
TrainConfig config(int accum = 1) {
  TrainConfig c;
  c.model = "llama-tiny";
  c.n_layer = 4;
  c.seq_len = 256;
  c.batch = 1;
  c.grad_accum = accum;
  c.steps = 0;
  c.precision = "fp32";
  c.ranks = 4;
  c.zero_auto = true;
  c.ckpt = "auto";
  c.act_compress = "none";
  c.threads = 1;
  c.mem_limit = "1GiB";
  c.data_dir = test::empty_data_dir("layout_search");
  return c;
}

// Every world rank's peak of the run a candidate names (each stage's every data rank), the
// largest: what the budget must hold.
size_t largest_world_rank_peak(const RunSpec& run) {
  size_t most = 0;
  for (int s = 0; s < run.pp(); ++s)
    plan_every_rank(run.stage(s), [&](int, const PlanReport& p) {
      most = std::max(most, p.peak_bytes);
    });
  return most;
}

// The data-parallel layout's least peak at any policy and stage (the search as before).
size_t data_parallel_least_peak(const RunSpec& spec) {
  const SearchResult dp = search_training(spec, SIZE_MAX, SearchSpace::of(spec));
  return dp.smallest.peak_bytes;
}

TEST(LayoutSearch, TriesTheDivisorsUpToANodeAndKeepsTheGlobalBatch) {
  EXPECT_EQ(tensor_candidates(128, 0), (std::vector<int>{1, 2, 4, 8}));
  EXPECT_EQ(tensor_candidates(12, 4), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(pipeline_candidates(16, 6), (std::vector<int>{1, 2, 4}));
  for (const std::string& p : coarse_policies(8, AttentionKind::flash))
    EXPECT_NE(p.rfind("layers:", 0), 0u) << p;
  const RunSpec spec = resolve_run(config(2));
  const RunSpec run = layout_run(spec, 2, 2, true);
  EXPECT_EQ(run.model.tp, 2);
  EXPECT_TRUE(run.sp);
  EXPECT_EQ(run.pp(), 2);
  EXPECT_EQ(run.world, 1);
  // 4 data ranks x 1 x 2 rows = 1 data rank x 1 x 8.
  EXPECT_EQ(run.world * run.batch * run.grad_accum, spec.world * spec.batch * spec.grad_accum);
  EXPECT_THROW(layout_run(spec, 3, 1, false), Error);  // 3 does not divide 4 ranks
}

TEST(LayoutSearch, ASplitLayoutIsChosenWhereOnlyASplitFitsAndItsPlanFits) {
  const RunSpec spec = resolve_run(config());
  const size_t limit = data_parallel_least_peak(spec) - 1;  // no dp x 1 x 1 candidate fits
  const SearchResult r = search_layouts(spec, limit, SearchSpace::of(spec));
  ASSERT_TRUE(r.fits) << r.message;
  EXPECT_TRUE(r.with_layout);
  EXPECT_GT(r.choice.tp * r.choice.pp, 1) << r.message;
  const RunSpec run = apply_candidate(spec, r.choice);
  EXPECT_EQ(run.world * run.model.tp * run.pp(), 4);
  EXPECT_EQ(run.world * run.batch * run.grad_accum, spec.world * spec.batch * spec.grad_accum);
  // The candidate's peak is the largest world rank's, and it fits.
  EXPECT_EQ(r.choice.peak_bytes, largest_world_rank_peak(run)) << r.message;
  EXPECT_LE(largest_world_rank_peak(run), limit);
  // No data-parallel candidate fits; the table names every layout tried.
  for (const Candidate& c : r.candidates)
    if (c.tp * c.pp == 1) {
      EXPECT_FALSE(c.fits) << candidate_options(c, true, true);
    }
  EXPECT_GE(r.layouts.size(), 3u);
  EXPECT_NE(r.message.find(fmt::format("--tp {}", r.choice.tp)), std::string::npos) << r.message;
}

TEST(LayoutSearch, WhereEverythingFitsTheDataParallelLayoutIsKept) {
  // 8 micro-batches a data rank: a split layout pays its tensor collectives or its transfers
  // on 4 times as many micro-batches, the data group's all-reduce is once a step.
  const RunSpec spec = resolve_run(config(8));
  const SearchResult r = search_layouts(spec, size_t{64} << 30, SearchSpace::of(spec));
  ASSERT_TRUE(r.fits) << r.message;
  EXPECT_EQ(r.choice.tp, 1) << r.message;
  EXPECT_EQ(r.choice.pp, 1) << r.message;
  bool split_fits = false;
  for (const Candidate& c : r.candidates) {
    split_fits |= c.fits && c.tp * c.pp > 1;
    if (c.fits) {
      EXPECT_FALSE(preferred(c, r.choice)) << candidate_options(c, true, true);
    }
  }
  EXPECT_TRUE(split_fits);  // the split layouts were planned, and lost on time
}

// APOLLO is refused under --tp (RunSpec::check_tensor_parallel: the projection of a slice is
// another algorithm) and built under --pp (a stage holds whole matrices; --sync-every-micro-batch
// and Lion were this test's refusals under --pp until they were built there): no tensor-split
// layout is a candidate, the table says why, and every candidate is one the run accepts (as ZeRO
// stages and levers a layout refuses are skipped, and would join once built).
TEST(LayoutSearch, ACombinationTheRunRefusesIsNeverChosen) {
  TrainConfig c = config();
  c.optim.name = "apollo";
  const RunSpec spec = resolve_run(c);
  const size_t limit = data_parallel_least_peak(spec) - 1;
  const SearchResult r = search_layouts(spec, limit, SearchSpace::of(spec));
  ASSERT_TRUE(r.fits) << r.message;
  EXPECT_GT(r.choice.pp, 1);
  EXPECT_EQ(r.choice.tp, 1);
  for (const Candidate& k : r.candidates) {
    EXPECT_EQ(k.tp, 1) << candidate_options(k, true, true);
    EXPECT_NO_THROW(apply_candidate(spec, k).check()) << candidate_options(k, true, true);
  }
  const bool said = std::any_of(r.layouts.begin(), r.layouts.end(), [](const std::string& l) {
    return l.find("tp 2") != std::string::npos && l.find("refused") != std::string::npos;
  });
  EXPECT_TRUE(said);
  // And with AdamW every candidate the search kept is accepted too (under --pp: ZeRO 0-1 and
  // no compression today).
  const RunSpec adamw = resolve_run(config());
  const SearchResult a = search_layouts(adamw, SIZE_MAX, SearchSpace::of(adamw));
  bool pipelined = false;
  for (const Candidate& k : a.candidates) {
    pipelined |= k.pp > 1;
    EXPECT_NO_THROW(apply_candidate(adamw, k).check()) << candidate_options(k, true, true);
  }
  std::string lines;
  for (const std::string& l : a.layouts) lines += l + "\n";
  EXPECT_TRUE(pipelined) << lines;
}

}  // namespace
}  // namespace memfit
