// --pp with ZeRO on the data group (Note [Pipeline parallel], "ZeRO"), end to end under mpirun:
// two data ranks of two stages, each stage's state cut into its data ranks' shards of the
// stage's own layout. Stage 1: each rank steps its shard of the optimizer state and master
// weights, the working weights all-gathered. Stage 2: each stage's data ranks reduce-scatter its
// own units' gradients (the units mapped from the stage's blocks: model/unit_map.h) into their
// shards. Stage 3: the stage's units gathered as its phases use them, the forwards alone (to
// send the output) too. --grad-dtype bf16: the stage's units reduced in bf16. Against the
// data-parallel run without stages at the same options: LLaMA's losses and validation losses
// bit for bit (every unit's sums are the same sums in the same order; without clipping the
// update does not read the norm, which adds each stage's shards in another order and agrees
// within 1e-6); a tied GPT-2 within the tied tolerance (pipeline_tied_test: the two stages add
// the table's gradient parts once a step). The plan is every world rank's measured peak by
// category.
#include "pipeline_test_util.h"

namespace memfit {
namespace {

using nlohmann::json;

class PipelineZero : public test::PipelineBinaryTest {
 protected:
  PipelineZero() : PipelineBinaryTest(4346) {}

  // `more` over two data ranks (of `tp` tensor ranks each), without stages and as two stages:
  // the losses within `rel` (0: bit for bit), the norms within `rel_norm`.
  void expect_stages_match(const std::string& more, double rel, const std::string& what,
                           double rel_norm = 1e-6, int tp = 1, int pp = 2) {
    const std::string a = std::string(kSteps) + " " + more;
    const auto dp = train(2 * tp, a, "dp2"),
               both = train(2 * pp * tp, a + fmt::format(" --pp {}", pp), "dp2pp");
    expect_close(dp, both, {"loss", "val_loss"}, rel, what, 4);
    expect_close(dp, both, {"grad_norm"}, rel_norm, what, 3);
  }
  static constexpr const char* kSteps =
      "--steps 3 --grad-accum 2 --clip 0 --eval-every 3 --eval-batches 1";
};

TEST_F(PipelineZero, Stage1OverTwoDataRanksOfTwoStagesMatchesDataParallelism) {
  for (const char* precision : {"", "--precision bf16", "--precision bf16 --master-weights none"})
    expect_stages_match(fmt::format("--zero 1 {}", precision), 0,
                        fmt::format("zero 1 {}", precision));
  expect_stages_match("--zero 1 --model gpt2-tiny", 1e-6, "zero 1, tied gpt2");
}

// ZeRO 2 and 3 (and 3 in bf16 with sharded master weights): each stage's units reduced per unit
// into its data shards, and at stage 3 gathered. A tied GPT-2's table gradient is summed between
// the first stage's and the last stage's shards, cut differently (dist::tied_shard_pieces).
TEST_F(PipelineZero, Stages2And3OverTwoDataRanksOfTwoStagesMatchDataParallelism) {
  expect_stages_match("--zero 2", 0, "zero 2");
  expect_stages_match("--zero 3", 0, "zero 3");
  expect_stages_match("--zero 3 --precision bf16", 0, "zero 3, bf16");
  expect_stages_match("--zero 2 --model gpt2-tiny", 1e-6, "zero 2, tied gpt2");
  expect_stages_match("--zero 3 --model gpt2-tiny", 1e-6, "zero 3, tied gpt2");
}

// --grad-dtype bf16: each stage's units reduced and accumulated in bf16 (Note [Gradients in
// bf16]), at ZeRO 0 (all-reduced whole) and 2. LLaMA: the same bf16 sums in the same order, bit
// for bit; a tied GPT-2: the table's two parts are rounded to bf16 once more before their sum.
TEST_F(PipelineZero, Bf16GradientsMatchTheRunWithoutStages) {
  expect_stages_match("--grad-dtype bf16", 0, "bf16 gradients");
  expect_stages_match("--grad-dtype bf16 --zero 2 --precision bf16", 0,
                      "bf16 gradients, zero 2, bf16");
  // (Measured on the Zen 5: losses 2.7e-6, norms 2.9e-5.)
  expect_stages_match("--grad-dtype bf16 --model gpt2-tiny", 1e-5, "bf16 gradients, tied gpt2",
                      1e-4);
}

// Four stages of one block each (dp 2 x pp 4, 8 ranks): the middle stages hold blocks alone,
// no edge unit (no edge gradient buffer, nothing persistent at stage 3).
TEST_F(PipelineZero, MiddleStagesHoldBlocksAlone) {
  expect_stages_match("--zero 3", 0, "pp 4, zero 3", 1e-6, 1, 4);
  expect_stages_match("--zero 2 --model gpt2-tiny", 1e-6, "pp 4, zero 2, tied gpt2", 1e-6, 1, 4);
  expect_plan_is_measured(8, "--steps 2 --grad-accum 2 --pp 4 --zero 3");
}

// With --tp 2 (dp 2 x pp 2 x tp 2, 8 ranks, against dp 2 x tp 2): each stage a tensor group,
// its units the tensor rank's slices; a tied table's shards exchanged between the peers of one
// tensor index. The same bits as without stages.
TEST_F(PipelineZero, ComposesWithTensorParallelism) {
  expect_stages_match("--tp 2 --zero 3 --grad-dtype bf16", 0, "tp 2, zero 3, bf16 gradients",
                      1e-6, 2);
  expect_stages_match("--tp 2 --zero 2 --model gpt2-tiny", 1e-6, "tp 2, zero 2, tied gpt2", 1e-6,
                      2);
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

// ZeRO 2-3 and bf16 gradients: every world rank's peak by category as planned (the stage's
// unit buffers, its gathers, the tied table's exchange buffer), and the gradients' sums a shard
// (ZeRO 2-3) or half of f32's (bf16).
TEST_F(PipelineZero, ThePlanIsEveryRanksMeasuredPeakAtStages2And3AndWithBf16Gradients) {
  const std::string a = "--steps 2 --grad-accum 2 --pp 2 ";
  ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size 4 --zero 1 --json", args(a))), 0)
      << test::slurp(dir / "err.txt");
  const json zero1 = json::parse(test::slurp(dir / "out.txt"));
  for (const std::string more : {"--zero 2", "--zero 3", "--grad-dtype bf16",
                                 "--zero 3 --model gpt2-tiny --grad-dtype bf16"}) {
    const json plan = expect_plan_is_measured(4, a + more);
    // Rank 0 (stage 0, before the last: at stage 3 its forwards alone gather its blocks too)
    // logs each step's collectives as the plan counts them for its stage.
    int steps = 0;
    for (const json& j : lines(dir / "plan.jsonl")) {
      if (!j.contains("loss")) continue;
      ++steps;
      for (const char* c : {"all_reduce", "reduce_scatter", "all_gather"})
        EXPECT_EQ(j["comm_bytes"][c], plan["stages"][0]["comm_per_step"][c]) << c << ", " << more;
    }
    EXPECT_EQ(steps, 2) << more;
    if (more.find("gpt2") != std::string::npos) continue;
    for (size_t q = 0; q < 4; ++q) {
      const size_t grads = plan["per_rank"][q]["by_category"].value("grads", size_t{0}),
                   whole = zero1["per_rank"][q]["by_category"].value("grads", size_t{0});
      EXPECT_LT(grads, more == "--grad-dtype bf16" ? whole / 2 + 4096 : whole * 2 / 3)
          << more << ", rank " << q;
    }
  }
}

}  // namespace
}  // namespace memfit
