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
  // (fp8: Fp8StoresCodesOnEveryStageAndGivesOneProcesssBits below.)
  for (const char* precision : {"--precision bf16", "--precision bf16 --master-weights none"}) {
    const std::string a = fmt::format("{} {}", kSteps, precision);
    expect_close(train(0, a, "one"), train(2, a + " --pp 2", "pp2"),
                 {"loss", "grad_norm", "val_loss"}, 0, fmt::format("--pp 2 {}", precision));
  }
  // Four stages under GPipe, pure bf16 (every stage's rounding drawn by whole-model indices).
  const std::string a = std::string(kSteps) + " --precision bf16 --master-weights none";
  expect_close(train(0, a, "one"), train(4, a + " --pp 4 --pp-schedule gpipe", "pp4"),
               {"loss", "grad_norm", "val_loss"}, 0, "--pp 4 gpipe, pure bf16");
}

// --precision fp8 with its linears stored as E4M3 codes on every stage (Note [FP8], "Under --tp
// and --pp"): a stage holds whole matrices, each encoded from its own master weights with its
// own amax's scale, and every cast's tensor lies in one stage, so LLaMA at --pp 2 and at --pp 4
// under GPipe gives one process's losses, norms and validation losses bit for bit and saves one
// process's files byte for byte; a checkpoint one process saved resumes under --pp 2 (each
// stage encodes its codes from the loaded master weights) and continues as the run that never
// stopped. GPT-2 (always tied: the table's gradient is one process's within float rounding,
// pipeline_tied_test) within 1e-6 of one process, and its stored codes give the bits of the
// same layout with bf16 working weights cast at each use (kept where the optimizer is
// offloaded).
TEST_F(PipelinePrecision, Fp8StoresCodesOnEveryStageAndGivesOneProcesssBits) {
  auto save = [&](const char* name) {
    return fmt::format(" --save '{}'", (dir / name).string());
  };
  const std::vector<const char*> keys = {"loss", "grad_norm", "val_loss"};
  const std::string fp8 = std::string(kSteps) + " --precision fp8";
  const auto ref = train(0, fp8 + save("one"), "one");
  expect_close(ref, train(2, fp8 + " --pp 2" + save("pp2"), "pp2"), keys, 0, "--pp 2 fp8");
  const std::string err = test::slurp(dir / "err.txt");
  EXPECT_NE(err.find("stored as E4M3 codes, one byte each, with a scale per matrix, each "
                     "pipeline stage its own matrices"),
            std::string::npos)
      << err;
  for (const char* f : {"model.safetensors", "optimizer.safetensors"}) {
    const std::string a = test::slurp(dir / "one" / f), b = test::slurp(dir / "pp2" / f);
    EXPECT_FALSE(a.empty()) << f;
    EXPECT_TRUE(a == b) << "--pp 2 fp8's " << f << " is not one process's";
  }
  expect_close(ref, train(4, fp8 + " --pp 4 --pp-schedule gpipe", "pp4"), keys, 0,
               "--pp 4 gpipe fp8");
  train(0, fp8 + " --stop-after 2" + save("half"), "half");
  const auto resumed =
      train(2, fmt::format("{} --pp 2 --resume '{}'", fp8, (dir / "half").string()), "resumed");
  int compared = 0;
  for (const json& r : resumed)
    for (const json& w : ref)
      if (r.contains("loss") && w.contains("loss") && w["step"] == r["step"]) {
        EXPECT_GT(r["step"].get<int>(), 2);
        EXPECT_EQ(w["loss"].get<double>(), r["loss"].get<double>()) << r;
        EXPECT_EQ(w["grad_norm"].get<double>(), r["grad_norm"].get<double>()) << r;
        ++compared;
      }
  EXPECT_EQ(compared, 2);
  const std::string gpt2 = fp8 + " --model gpt2-tiny";
  const auto stored = train(2, gpt2 + " --pp 2", "gpt2-pp2");
  expect_close(train(0, gpt2, "gpt2-one"), stored, keys, 1e-6, "gpt2 --pp 2 fp8");
  const auto cast = train(
      2,
      fmt::format("{} --pp 2 --offload-optimizer nvme --offload-dir '{}'", gpt2,
                  (dir / "off").string()),
      "gpt2-cast");
  EXPECT_NE(test::slurp(dir / "err.txt").find("stored as bf16 and cast"), std::string::npos);
  expect_close(cast, stored, keys, 0, "gpt2 --pp 2 fp8: stored codes against cast bf16 weights");
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
           {4, "--pp 4 --precision fp8 --pp-schedule gpipe --model gpt2-tiny"},
           {4, "--pp 4 --precision bf16 --pp-schedule gpipe"},
           {4, "--pp 2 --precision bf16 --master-weights none"}}) {
    const json plan = expect_plan_is_measured(ranks, "--steps 2 --grad-accum 4 " + more);
    // The stages' master weights are the model's f32 parameters, split (none when pure).
    const bool master = more.find("none") == std::string::npos;
    for (const json& s : plan["stages"])
      EXPECT_EQ(s["by_category"].value("master", size_t{0}) > 0, master) << more;
  }
  // fp8 stores each stage's linears at one byte (and a scale per matrix): every stage's params
  // below bf16's by nearly a byte a linear weight (llama-tiny's 4 blocks of 192 x 96 (q|k|v),
  // 96 x 96, 512 x 96 (gate|up) and 96 x 256 weights, two on each stage), the master weights
  // bf16's.
  auto stages = [&](const char* precision) {
    EXPECT_EQ(run_memfit(fmt::format("plan {} --world-size 2 --json",
                                     args(fmt::format("--steps 2 --pp 2 --precision {}",
                                                      precision)))),
              0)
        << test::slurp(dir / "err.txt");
    return json::parse(test::slurp(dir / "out.txt"))["stages"];
  };
  const json bf16 = stages("bf16"), fp8 = stages("fp8");
  ASSERT_EQ(fp8.size(), 2u);
  for (size_t s = 0; s < 2; ++s) {
    const int64_t saved = bf16[s]["by_category"]["params"].get<int64_t>() -
                          fp8[s]["by_category"]["params"].get<int64_t>();
    EXPECT_GT(saved, 0) << "stage " << s;
    EXPECT_NEAR(double(saved), 2.0 * (192 * 96 + 96 * 96 + 512 * 96 + 96 * 256), 4096)
        << "stage " << s;
    EXPECT_EQ(bf16[s]["by_category"]["master"], fp8[s]["by_category"]["master"]) << s;
  }
}

}  // namespace
}  // namespace memfit
