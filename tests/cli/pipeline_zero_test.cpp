// --pp with ZeRO stage 1 on the data group (Note [Pipeline parallel], "ZeRO"), end to end
// under mpirun: two data ranks of two stages, each stage's optimizer state and master weights
// cut into its data ranks' shards of the stage's own layout, each rank stepping its shard and
// the working weights all-gathered over the data group. Against the data-parallel run without
// stages (whose ZeRO stages give the same bits: Note [ZeRO]): LLaMA's losses and validation
// losses bit for bit (without clipping the update does not read the norm, which adds each
// stage's shards in another order and agrees within 1e-6); a tied GPT-2 within the tied
// tolerance (pipeline_tied_test). The plan is every world rank's measured peak by category.
#include "pipeline_test_util.h"

namespace memfit {
namespace {

using nlohmann::json;

class PipelineZero : public test::PipelineBinaryTest {
 protected:
  PipelineZero() : PipelineBinaryTest(4346) {}
};

constexpr const char* kSteps =
    "--steps 3 --grad-accum 2 --clip 0 --eval-every 3 --eval-batches 1 --zero 1";

TEST_F(PipelineZero, Stage1OverTwoDataRanksOfTwoStagesMatchesDataParallelism) {
  for (const char* precision : {"", "--precision bf16", "--precision bf16 --master-weights none"}) {
    const std::string a = fmt::format("{} {}", kSteps, precision);
    const auto dp = train(2, a, "dp2"), both = train(4, a + " --pp 2", "dp2pp2");
    expect_close(dp, both, {"loss", "val_loss"}, 0, fmt::format("zero 1 {}", precision), 4);
    expect_close(dp, both, {"grad_norm"}, 1e-6, fmt::format("zero 1 {}", precision), 3);
  }
  const std::string gpt2 = std::string(kSteps) + " --model gpt2-tiny";
  expect_close(train(2, gpt2, "dp2"), train(4, gpt2 + " --pp 2", "dp2pp2"),
               {"loss", "grad_norm", "val_loss"}, 1e-6, "zero 1, tied gpt2", 4);
}

TEST_F(PipelineZero, ThePlanIsEveryRanksMeasuredPeak) {
  for (const std::string more : {"--pp 2", "--pp 2 --precision bf16", "--pp 2 --model gpt2-tiny"}) {
    const std::string a = "--steps 2 --grad-accum 2 " + more;
    const json plan = expect_plan_is_measured(4, a + " --zero 1");
    // Each rank's optimizer state is its data shard of its stage's: less than at ZeRO 0.
    ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size 4 --json", args(a))), 0)
        << test::slurp(dir / "err.txt");
    const json zero0 = json::parse(test::slurp(dir / "out.txt"));
    for (size_t q = 0; q < 4; ++q)
      EXPECT_LT(plan["per_rank"][q]["by_category"].value("optimizer", size_t{0}),
                zero0["per_rank"][q]["by_category"].value("optimizer", size_t{0}))
          << more << ", rank " << q;
  }
}

}  // namespace
}  // namespace memfit
