// `memfit plan --auto --world-size 4` with neither --tp nor --pp chooses the layout too
// (plan/layout_search.h; Note [Fit a budget], "Layouts"): under a budget one byte below the
// data-parallel layout's least peak it picks a tensor or pipeline split, and that layout, trained
// under mpirun with the options the plan names, measures on every world rank the peak the plan
// gives it, by category. `memfit train` has no layout search (plan only): the test trains the
// options the plan printed. Skips where memfit was built without MPI.
#include "pipeline_test_util.h"

namespace memfit {
namespace {

using nlohmann::json;

class AutoLayout : public test::PipelineBinaryTest {
 protected:
  AutoLayout() : PipelineBinaryTest(4351) {}
  json plan(const std::string& more) {
    EXPECT_EQ(run_memfit(fmt::format("plan {} --world-size 4 --json", args(more))), 0)
        << more << ": " << test::slurp(dir / "err.txt");
    return json::parse(test::slurp(dir / "out.txt"));
  }
  void expect_chosen_split_trains_as_planned(const std::string& budget_options);
};

// The layout `--auto` chose under `budget_options` (with --ranks-per-node 1 the tensor groups are
// one rank: the split must be a pipeline), trained, every rank's measured peak the plan's.
void AutoLayout::expect_chosen_split_trains_as_planned(const std::string& budget_options) {
  const std::string steps = "--steps 2 --clip 0 --act-compress none " + budget_options;
  // The data-parallel layout alone (--tp 1 given: no layout search), its least peak.
  const json dp = plan(steps + " --tp 1 --auto --mem-limit 64GiB");
  const size_t least = dp["search"]["smallest"]["peak_bytes"].get<size_t>();
  const json chosen = plan(fmt::format("{} --auto --mem-limit {}", steps, least - 1));
  const json& search = chosen["search"];
  ASSERT_TRUE(search["fits"].get<bool>()) << search.dump(2);
  ASSERT_TRUE(search["searched_layout"].get<bool>());
  const json& c = search["choice"];
  const int tp = c["tp"].get<int>(), pp = c["pp"].get<int>();
  ASSERT_GT(tp * pp, 1) << search.dump(2);
  if (budget_options.find("--ranks-per-node 1") != std::string::npos) {
    EXPECT_EQ(tp, 1);
  }
  EXPECT_FALSE(search["layouts"].empty());
  std::string more = fmt::format("{} --ckpt {} --grad-accum {} --zero {} --tp {}{} --pp {}",
                                 steps, c["ckpt"].get<std::string>(),
                                 c["grad_accum"].get<int>(), c["zero"].get<int>(), tp,
                                 c["sp"].get<bool>() ? " --sp" : "", pp);
  for (const json& lever : c["precision_levers"]) more += " " + lever.get<std::string>();
  if (pp > 1) {
    // The plan's balanced cut given to the run (a calibration measured again in between could
    // move a cut by a block: Note [Pipeline parallel], "The step's time").
    const json cut = plan(more);
    std::string counts;
    for (const json& st : cut["stages"]) {
      const std::string blocks = st["blocks"].get<std::string>();  // "a-b"
      const size_t dash = blocks.find('-');
      const int n = std::stoi(blocks.substr(dash + 1)) - std::stoi(blocks.substr(0, dash)) + 1;
      counts += (counts.empty() ? "" : ",") + std::to_string(n);
    }
    more += " --pp-layers " + counts;
    const json p = expect_plan_is_measured(4, more);
    size_t most = 0;
    for (const json& q : p["per_rank"]) most = std::max(most, q["peak_bytes"].get<size_t>());
    EXPECT_LT(most, least) << more;
    return;
  }
  // Tensor groups alone: the plan's per_rank is each data rank's (its tensor ranks alike).
  const json p = plan(more);
  const auto log = train(4, more, "chosen");
  json measured;
  for (const json& j : log)
    if (j.contains("ranks")) measured = j["ranks"];
  ASSERT_EQ(measured.size(), 4u) << more;
  for (int q = 0; q < 4; ++q) {
    const json& planned = p["per_rank"][q / tp];
    EXPECT_EQ(measured[q]["peak_bytes"], planned["peak_bytes"]) << more << ", rank " << q;
    EXPECT_LT(planned["peak_bytes"].get<size_t>(), least) << more;
    for (const char* cat : {"params", "master", "grads", "optimizer", "activations", "workspace",
                            "comm", "staging"})
      EXPECT_EQ(measured[q]["mem"].value(cat, size_t{0}),
                planned["by_category"].value(cat, size_t{0}))
          << cat << ", " << more << ", rank " << q;
  }
}

TEST_F(AutoLayout, TheChosenSplitTrainsAtItsPlannedPeakOnEveryRank) {
  expect_chosen_split_trains_as_planned("");
}

TEST_F(AutoLayout, AChosenPipelineTrainsAtItsPlannedPeakOnEveryRank) {
  expect_chosen_split_trains_as_planned("--ranks-per-node 1");
}

}  // namespace
}  // namespace memfit
