// --pp-schedule interleaved with every optimizer, compressed activations and fp8, end to end
// under mpirun (Note [Pipeline parallel], "Interleaved"): each of a rank's V chunks is a stage
// of the P x V with its own optimizer over its own layout, so what holds for a 1F1B stage holds
// per chunk (tests/cli/pipeline_optimizers_test.cpp, pipeline_precision_test.cpp): LLaMA
// (untied) gives one process's losses, gradient norms and validation losses with the same
// --grad-accum bit for bit, and a save is one process's files byte for byte. A rank's chunks
// are not contiguous in the model, so APOLLO's projections are drawn from each chunk's own
// parameter base, and pure bf16 rounds by each chunk's whole-model element indices. --pp-layers
// auto balances the P x V chunks. LoRA: each chunk its blocks' adapters, a save gathering every
// chunk's part. The plan is every world rank's measured peak by category.
// Skips where memfit was built without MPI.
#include "pipeline_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class PipelineInterleavedOptim : public test::PipelineBinaryTest {
 protected:
  PipelineInterleavedOptim() : PipelineBinaryTest(4361) {}
  // Every file of two saves is the same bytes.
  void expect_same_save(const std::string& x, const std::string& y, const std::string& what) {
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "config.json"}) {
      const std::string a = test::slurp(dir / x / f), b = test::slurp(dir / y / f);
      EXPECT_FALSE(a.empty()) << what << ": " << x << "/" << f;
      EXPECT_TRUE(a == b) << what << ": " << x << "/" << f << " differs from " << y << "'s";
    }
  }
};

// Four micro-batches, clipping that binds (the norm over every chunk decides it), a validation
// loss every two steps.
constexpr const char* kSteps =
    "--steps 4 --grad-accum 4 --clip 0.05 --eval-every 2 --eval-batches 2";
constexpr const char* kIv = " --pp 2 --pp-schedule interleaved --pp-virtual 2";

// pp 2 V 2 (rank 0 holds virtual stages 0 and 2): every optimizer's numbers and its save are
// one process's; APOLLO from chunk 1's own base (virtual stage 2's first parameter), not rank
// 0's.
TEST_F(PipelineInterleavedOptim, EveryOptimizerIsOneProcessBitForBit) {
  for (const char* optim : {"adamw8bit", "lion", "lion8bit", "adamw4bit", "adam-mini", "apollo",
                            "apollo-mini", "galore", "galore8bit"}) {
    const std::string a = fmt::format("{} --optim {}", kSteps, optim);
    const std::string what = fmt::format("pp 2 V 2 --optim {}", optim);
    const auto one = train(0, fmt::format("{} --save '{}'", a, (dir / "one").string()), "one");
    const auto iv = train(2, fmt::format("{}{} --save '{}'", a, kIv, (dir / "iv").string()), "iv");
    expect_close(one, iv, {"loss", "grad_norm", "val_loss"}, 0, what);
    expect_same_save("one", "iv", what);
  }
}

// One more layout, pp 2 V 3 (6 blocks: rank 0 holds virtual stages 0, 2 and 4), with APOLLO and
// pure bf16 (stochastic rounding by each chunk's whole-model element indices).
TEST_F(PipelineInterleavedOptim, ThreeChunksARankWithPureBf16) {
  for (const char* more : {"--optim apollo", "--optim adamw8bit --precision bf16 --master-weights none",
                           "--optim apollo-mini --precision bf16 --master-weights none"}) {
    const std::string a = fmt::format("{} --n-layer 6 {}", kSteps, more);
    expect_close(train(0, a, "one"),
                 train(2, a + " --pp 2 --pp-schedule interleaved --pp-virtual 3", "pp2v3"),
                 {"loss", "grad_norm", "val_loss"}, 0, fmt::format("pp 2 V 3 {}", more));
  }
}

// Stages of tensor groups: Adam-mini's row-parallel rows take their sums over each chunk's
// tensor group (the tensor split set on every chunk's optimizer), Lion steps a chunk's slices
// element by element; within --tp's tolerance of one process, as 1F1B's pp x tp. (--tp refuses
// the block-wise optimizers at this width: a slice would cut their quantisation blocks.)
TEST_F(PipelineInterleavedOptim, OptimizersOverStagesOfTensorGroups) {
  for (const char* optim : {"adam-mini", "lion"}) {
    const std::string a = fmt::format("{} --optim {}", kSteps, optim);
    expect_close(train(0, a, "one"), train(4, a + kIv + " --tp 2", "pp2v2tp2"),
                 {"loss", "grad_norm", "val_loss"}, 3e-6,
                 fmt::format("pp 2 V 2 tp 2 --optim {}", optim));
  }
}

// Each chunk compresses its own blocks' saved activations (int8, fp8; with --ckpt full the
// re-materialising forward compresses them again, the same codes); fp8's casts scale by each
// tensor's amax, and every tensor lies in one chunk: one process's bits.
TEST_F(PipelineInterleavedOptim, CompressedActivationsAndFp8AreOneProcessBitForBit) {
  for (const char* more : {"--act-compress int8", "--act-compress fp8",
                           "--act-compress int8 --ckpt full", "--precision fp8",
                           "--precision fp8 --optim adamw8bit --act-compress int8"}) {
    const std::string a = fmt::format("{} {}", kSteps, more);
    expect_close(train(0, a, "one"), train(2, a + kIv, "iv"),
                 {"loss", "grad_norm", "val_loss", "loss_scale"}, 0,
                 fmt::format("pp 2 V 2 {}", more));
  }
}

// Every world rank's measured peak is its plan, by category: each chunk's optimizer state over
// its layout, its compressed saved activations, fp8's casts.
TEST_F(PipelineInterleavedOptim, ThePlanIsEveryRanksMeasuredPeak) {
  for (const auto& [ranks, more] : std::vector<std::pair<int, std::string>>{
           {2, "--optim adamw8bit"},
           {2, "--optim apollo"},
           {2, "--optim adam-mini --act-compress int8"},
           {2, "--optim galore8bit --precision fp8"},
           {4, "--zero 1 --optim adamw4bit --act-compress fp8"}})
    expect_plan_is_measured(ranks, fmt::format("--steps 2 --grad-accum 4 {}{}", more, kIv));
}

// --pp-layers auto balances the P x V chunks: a heavy head (a 32000-token vocabulary) on the
// last chunk takes blocks from it, so 8 blocks at pp 2 V 2 are not cut 2,2,2,2; the run of the
// plan's cut is the plan's peak on every rank, and a run left to choose its own cut trains.
TEST_F(PipelineInterleavedOptim, AutoBalancesTheChunks) {
  const std::string a = std::string("--steps 2 --grad-accum 4 --n-layer 8 --vocab 32000") + kIv;
  ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size 2 --json", args(a))), 0)
      << test::slurp(dir / "err.txt");
  const json plan = json::parse(test::slurp(dir / "out.txt"));
  std::vector<int> counts;
  std::istringstream ranges(plan["pp_layers"].get<std::string>());
  for (std::string r; std::getline(ranges, r, ',');) {
    const size_t dash = r.find('-');
    counts.push_back(std::stoi(r.substr(dash + 1)) - std::stoi(r.substr(0, dash)) + 1);
  }
  ASSERT_EQ(counts.size(), 4u) << plan["pp_layers"];
  EXPECT_NE(counts, (std::vector<int>{2, 2, 2, 2})) << plan["pp_layers"];
  EXPECT_LT(counts.back(), 2) << "the head's chunk keeps the even split's blocks: "
                              << plan["pp_layers"];
  EXPECT_NE(plan.value("pp_layers_note", "").find("chunk"), std::string::npos)
      << plan.value("pp_layers_note", "");
  std::string cut;
  for (int n : counts) cut += fmt::format("{}{}", cut.empty() ? "" : ",", n);
  // (The run is given the plan's cut: a later process may measure the calibration again.)
  expect_plan_is_measured(2, a + " --pp-layers " + cut);
  int steps = 0;
  for (const json& j : numbers(train(2, a, "auto"))) steps += j.contains("loss");
  EXPECT_EQ(steps, 2);
}

// LoRA (Note [LoRA], "Under --pp"): each chunk holds its blocks' adapters under the whole
// model's names, drawn from the whole model's, the norm added a block at a time in virtual-stage
// order; a save gathers every chunk's part of the whole adapters (gather_adapters). LLaMA and a
// tied GPT-2 (its frozen table has no gradient to sum) at pp 2 V 2 give one process's bits; a
// GPT-2 save is one process's files, and a save stopped after two steps and resumed at pp 2 V 2
// finishes as one process's. Plan == measured, also over two data ranks.
constexpr const char* kLora =
    "--steps 4 --grad-accum 4 --clip 0.05 --eval-every 2 --eval-batches 2 --lr 1e-2 "
    "--repeat-batch --lora-rank 4 --lora-alpha 8";

TEST_F(PipelineInterleavedOptim, LoraIsOneProcessBitForBitAndSavesItsFiles) {
  for (const char* model : {"", " --model gpt2-tiny"}) {
    const std::string a = std::string(kLora) + model;
    expect_close(train(0, a, "one"), train(2, a + kIv, "iv"), {"loss", "grad_norm", "val_loss"},
                 0, fmt::format("LoRA{} pp 2 V 2", model));
  }
  const std::string g = std::string(kLora) + " --model gpt2-tiny";
  auto at = [&](const char* name) { return (dir / name).string(); };
  train(0, fmt::format("{} --save '{}'", g, at("one")), "save-one");
  train(2, fmt::format("{}{} --save '{}'", g, kIv, at("iv")), "save-iv");
  train(2, fmt::format("{}{} --stop-after 2 --save '{}'", g, kIv, at("half")), "half");
  train(2, fmt::format("{}{} --resume '{}' --save '{}'", g, kIv, at("half"), at("resumed")),
        "resumed");
  for (const char* f : {"adapter_model.safetensors", "adapter_optimizer.safetensors",
                        "model.safetensors", "adapter_config.json"}) {
    const std::string x = test::slurp(dir / "one" / f);
    ASSERT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == test::slurp(dir / "iv" / f)) << f << " differs at pp 2 V 2";
    EXPECT_TRUE(x == test::slurp(dir / "resumed" / f)) << f << " differs after a resume";
  }
  expect_plan_is_measured(2, std::string(kLora) + kIv);
  expect_plan_is_measured(4, std::string(kLora) + kIv + " --model gpt2-tiny --ckpt full");
}

// LoRA over stages of tensor groups: pp 2 V 2 x tp 2 within 3e-6 of one process (the tensor
// group's sums add in another order, as 1F1B's); without clipping (the norm's order is the only
// other difference) its save is 1F1B pp 2 x tp 2's byte for byte: every chunk's tensor slices
// gathered and placed whole.
TEST_F(PipelineInterleavedOptim, LoraOverStagesOfTensorGroups) {
  expect_close(train(0, kLora, "one"), train(4, std::string(kLora) + kIv + " --tp 2", "tp"),
               {"loss", "grad_norm", "val_loss"}, 3e-6, "LoRA pp 2 V 2 tp 2");
  const std::string a = "--steps 4 --grad-accum 4 --clip 0 --lr 1e-2 --repeat-batch "
                        "--lora-rank 4 --lora-alpha 8 --model gpt2-tiny --tp 2";
  train(4, fmt::format("{} --pp 2 --save '{}'", a, (dir / "f").string()), "f");
  train(4, fmt::format("{}{} --save '{}'", a, kIv, (dir / "v").string()), "v");
  for (const char* f : {"adapter_model.safetensors", "adapter_optimizer.safetensors",
                        "model.safetensors"}) {
    const std::string x = test::slurp(dir / "f" / f);
    ASSERT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == test::slurp(dir / "v" / f)) << f << " differs from 1F1B's";
  }
}

}  // namespace
}  // namespace memfit
