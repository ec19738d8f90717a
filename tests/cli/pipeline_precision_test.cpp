// --pp in bf16 (with master weights or pure) and fp16, end to end under mpirun (Note [Pipeline
// parallel], "Precisions"): LLaMA (untied) cut into 2 and 4 stages gives one process's losses,
// gradient norms and validation losses with the same --grad-accum bit for bit (GPT-2 ties its
// head: its precisions are pipeline_tied_test's, within its tolerance). Each
// stage rounds its own working weights from its own master weights (pure bf16: the stochastic
// rounding draws by the element's index in the whole model), the boundary between stages is
// the f32 residual stream, and fp16's overflow check is the finite flags of every stage
// gathered with the norm's parts: every stage skips the same steps, as one process does. The
// plan is every world rank's measured peak by category in each precision.
#include "pipeline_test_util.h"

namespace memfit {
namespace {

using nlohmann::json;

class PipelinePrecision : public test::PipelineBinaryTest {
 protected:
  PipelinePrecision() : PipelineBinaryTest(4344) {}
};

// Four micro-batches, clipping that binds, a validation loss every two steps.
constexpr const char* kSteps =
    "--steps 4 --grad-accum 4 --clip 0.05 --eval-every 2 --eval-batches 2";

TEST_F(PipelinePrecision, Bf16GivesOneProcesssNumbersBitForBit) {
  // fp8: each cast's scale is its tensor's amax, and every tensor lies in one stage (the stages
  // store bf16 working weights and cast them at each use, as the codes would decode).
  for (const char* precision :
       {"--precision bf16", "--precision bf16 --master-weights none", "--precision fp8"}) {
    const std::string a = fmt::format("{} {}", kSteps, precision);
    expect_close(train(0, a, "one"), train(2, a + " --pp 2", "pp2"),
                 {"loss", "grad_norm", "val_loss"}, 0, fmt::format("--pp 2 {}", precision));
  }
  // Four stages under GPipe, pure bf16 (every stage's rounding drawn by whole-model indices).
  const std::string a = std::string(kSteps) + " --precision bf16 --master-weights none";
  expect_close(train(0, a, "one"), train(4, a + " --pp 4 --pp-schedule gpipe", "pp4"),
               {"loss", "grad_norm", "val_loss"}, 0, "--pp 4 gpipe, pure bf16");
}

// A large initial scale overflows the first steps: every stage skips them together (the flags
// gathered with the norm), the scale halves alike, then it trains: one process's losses,
// norms, scales and skips.
TEST_F(PipelinePrecision, Fp16SkipsTheSameStepsOnEveryStageAsOneProcess) {
  const std::string a =
      "--steps 8 --grad-accum 4 --clip 0.05 --eval-every 4 --eval-batches 2 "
      "--precision fp16 --initial-loss-scale 16777216";
  const auto ref = train(0, a, "one");
  for (const auto& [ranks, pp] : {std::pair{2, " --pp 2"}, std::pair{4, " --pp 4"}}) {
    const auto got = train(ranks, a + pp, "pp");
    expect_close(ref, got, {"loss", "grad_norm", "val_loss", "loss_scale", "skipped"}, 0,
                 fmt::format("fp16{}", pp));
    int skipped = 0, updated = 0;
    for (const json& j : got)
      if (j.contains("skipped")) (j["skipped"].get<bool>() ? skipped : updated) += 1;
    EXPECT_GT(skipped, 0) << pp;
    EXPECT_GT(updated, 0) << pp;
  }
}

// Every world rank's measured peak is its stage's plan, by category: the bf16 working weights
// and the f32 master weights (or none), fp16's widened matmuls' workspace, the f32 boundary.
TEST_F(PipelinePrecision, ThePlanIsEveryRanksMeasuredPeak) {
  for (const auto& [ranks, more] : std::vector<std::pair<int, std::string>>{
           {2, "--pp 2 --precision bf16"},
           {2, "--pp 2 --precision bf16 --master-weights none"},
           {2, "--pp 2 --precision fp16"},
           {2, "--pp 2 --precision fp8"},
           {4, "--pp 4 --precision bf16 --pp-schedule gpipe"},
           {4, "--pp 2 --precision bf16 --master-weights none"}}) {
    const json plan = expect_plan_is_measured(ranks, "--steps 2 --grad-accum 4 " + more);
    // The stages' master weights are the model's f32 parameters, split (none when pure).
    const bool master = more.find("none") == std::string::npos;
    for (const json& s : plan["stages"])
      EXPECT_EQ(s["by_category"].value("master", size_t{0}) > 0, master) << more;
  }
}

}  // namespace
}  // namespace memfit
