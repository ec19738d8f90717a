// --pp with tied embeddings (GPT-2, or --tie-embeddings true), end to end under mpirun (Note
// [Pipeline parallel], "Tied embeddings"): the first stage holds the token table, the last a copy
// for its LM head; after the backward the two parts of the table's gradient (the embedding's,
// the head's) are summed between them and both apply the same update.
//
// Tolerance: one process adds the head's and the embedding's contributions into one
// accumulator micro-batch by micro-batch (head 0, embedding 0, head 1, ...), the stages each
// their own, added once at the end: the table's gradient is one process's up to float rounding
// (a few ulps of its elements), so the losses, validation losses and clipped gradient norms are
// compared within 1e-6 relative (1e-5 in bf16 and fp16, whose working weights are rounded from
// the master weights), not bit for bit; fp16's skipped steps and loss scales are the same. Every
// other parameter's gradient is one process's bits (the untied tests). The plan is every world
// rank's measured peak, the copy and the exchange's receive buffer included.
#include "pipeline_test_util.h"

namespace memfit {
namespace {

using nlohmann::json;

class PipelineTied : public test::PipelineBinaryTest {
 protected:
  PipelineTied() : PipelineBinaryTest(4345) {}
};

constexpr const char* kSteps =
    "--model gpt2-tiny --steps 4 --grad-accum 4 --clip 0.05 --eval-every 2 --eval-batches 2";
constexpr double kTolerance = 1e-6;

TEST_F(PipelineTied, Gpt2AtTwoAndFourStagesIsOneProcessWithinTolerance) {
  const auto ref = train(0, kSteps, "one");
  const std::string s(kSteps);
  expect_close(ref, train(2, s + " --pp 2", "pp2"), {"loss", "grad_norm", "val_loss"},
               kTolerance, "gpt2 --pp 2");
  expect_close(ref, train(4, s + " --pp 4 --pp-schedule gpipe", "pp4"),
               {"loss", "grad_norm", "val_loss"}, kTolerance, "gpt2 --pp 4 gpipe");
}

// Two data ranks of two stages: the data-parallel run's numbers within the tolerance (each
// stage's part summed over the data group first, then between the stages); LLaMA tied.
TEST_F(PipelineTied, DataRanksAndATiedLlama) {
  const std::string a = "--model gpt2-tiny --steps 3 --grad-accum 2 --clip 0.05 --eval-every 3 "
                        "--eval-batches 1";
  expect_close(train(2, a, "dp2"), train(4, a + " --pp 2", "dp2pp2"),
               {"loss", "grad_norm", "val_loss"}, kTolerance, "2 data x 2 stages", 4);
  const std::string llama =
      "--model llama-tiny --tie-embeddings true --steps 4 --grad-accum 4 --clip 0.05 "
      "--eval-every 2 --eval-batches 2";
  expect_close(train(0, llama, "one"), train(2, llama + " --pp 2", "pp2"),
               {"loss", "grad_norm", "val_loss"}, kTolerance, "llama tied --pp 2");
}

// GPT-2's precisions (it is always tied): bf16 with master weights and pure (the copy rounded
// with the table's indices), and fp16 with overflowing steps that every stage skips together.
TEST_F(PipelineTied, Gpt2InBf16AndFp16) {
  for (const char* precision : {"--precision bf16", "--precision bf16 --master-weights none"}) {
    const std::string a = fmt::format("{} {}", kSteps, precision);
    expect_close(train(0, a, "one"), train(2, a + " --pp 2", "pp2"),
                 {"loss", "grad_norm", "val_loss"}, 1e-5,
                 fmt::format("gpt2 {} --pp 2", precision));
  }
  const std::string a =
      "--model gpt2-tiny --steps 8 --grad-accum 4 --clip 0.05 --eval-every 4 --eval-batches 2 "
      "--precision fp16 --initial-loss-scale 16777216";
  const auto ref = train(0, a, "one"), got = train(2, a + " --pp 2", "pp2");
  expect_close(ref, got, {"loss", "grad_norm", "val_loss"}, 1e-5, "gpt2 fp16 --pp 2");
  expect_close(ref, got, {"loss_scale", "skipped"}, 0, "gpt2 fp16 --pp 2: the same skips");
  int skipped = 0, updated = 0;
  for (const json& j : got)
    if (j.contains("skipped")) (j["skipped"].get<bool>() ? skipped : updated) += 1;
  EXPECT_GT(skipped, 0);
  EXPECT_GT(updated, 0);
}

// Every world rank's measured peak is its stage's plan, by category: the last stage's
// parameters, gradients and optimizer state include the copy of the table, and the first and
// last stages' comm the exchange's receive buffer. The stages' parameters are the model's plus
// the copy.
TEST_F(PipelineTied, ThePlanIsEveryRanksMeasuredPeak) {
  ASSERT_EQ(run_memfit(fmt::format("plan {} --json", args("--model gpt2-tiny --steps 2"))), 0)
      << test::slurp(dir / "err.txt");
  const json whole = json::parse(test::slurp(dir / "out.txt"));
  const int64_t table = 512 * 96;  // gpt2-tiny's padded vocabulary x d_model
  for (const auto& [ranks, more] : std::vector<std::pair<int, std::string>>{
           {2, "--pp 2"}, {4, "--pp 4 --pp-schedule gpipe"}, {2, "--pp 2 --precision bf16"}}) {
    const json plan =
        expect_plan_is_measured(ranks, "--model gpt2-tiny --steps 2 --grad-accum 4 " + more);
    int64_t params = 0;
    for (const json& s : plan["stages"]) params += s["params"].get<int64_t>();
    EXPECT_EQ(params, whole["model"]["params"].get<int64_t>() + table) << more;
    const json& first = plan["stages"].front();
    const json& last = plan["stages"].back();
    EXPECT_GT(first["by_category"].value("comm", size_t{0}), 0u) << more;
    EXPECT_GT(last["by_category"].value("comm", size_t{0}), 0u) << more;
  }
}

}  // namespace
}  // namespace memfit
