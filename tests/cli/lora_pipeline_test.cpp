// LoRA under --pp end to end, through the built binary under mpirun (Note [LoRA], "Under --pp",
// docs/notes/lora.md): each stage holds its own blocks' adapters over its part of the frozen
// base. With the same accumulation the stages' gradients are one process's sums, and the norm
// adds each block's part in block order as one process does, so 1F1B and GPipe over 2 and 4
// stages give one process's losses, gradient norms and validation losses bit for bit (GPT-2 and
// LLaMA), and a save at --pp 2 is one process's save byte for byte (the adapters, their
// optimizer state, the base); --pp 2 x --tp 2 within 1e-6 (the norms 3e-6). `memfit plan` is every stage's
// measured peak by category. Skips where memfit was built without MPI.
#include <string>

#include <fmt/format.h>

#include "pipeline_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class LoraPipeline : public test::PipelineBinaryTest {
 protected:
  LoraPipeline() : PipelineBinaryTest(4747) {}
};

// Clipping that binds (the norm over every stage decides it), four micro-batches, --repeat-batch
// and a large rate so the adapters learn.
constexpr const char* kSteps =
    "--steps 4 --grad-accum 4 --clip 0.05 --eval-every 2 --eval-batches 2 --lr 1e-2 "
    "--repeat-batch --lora-rank 4 --lora-alpha 8";

TEST_F(LoraPipeline, StagesGiveOneProcesssNumbersBitForBit) {
  for (const char* model : {"", " --model gpt2-tiny"}) {
    const std::string a = std::string(kSteps) + model;
    const auto ref = train(0, a, "one");
    for (const char* schedule : {"1f1b", "gpipe"}) {
      const std::string s = fmt::format("{} --pp-schedule {}", a, schedule);
      expect_close(ref, train(2, s + " --pp 2", "pp2"), {"loss", "grad_norm", "val_loss"}, 0,
                   fmt::format("{} --pp 2 {}", model, schedule));
      expect_close(ref, train(4, s + " --pp 4", "pp4"), {"loss", "grad_norm", "val_loss"}, 0,
                   fmt::format("{} --pp 4 {}", model, schedule));
    }
    // Stages of tensor groups: the tensor group's sums add in another order; the norms, sums of
    // squares over every adapter, within 3e-6 as the base's pp x tp norms are (1.9e-6 in the
    // sanitizer build's AVX2 kernels, gpt2-tiny, step 3).
    const std::vector<json> tp = train(4, a + " --pp 2 --tp 2", "pp2tp2");
    expect_close(ref, tp, {"loss", "val_loss"}, 1e-6, fmt::format("{} --pp 2 --tp 2", model), 6);
    expect_close(ref, tp, {"grad_norm"}, 3e-6, fmt::format("{} --pp 2 --tp 2", model), 4);
  }
}

TEST_F(LoraPipeline, ASaveIsOneProcesssByteForByte) {
  const std::string a = std::string(kSteps) + " --model gpt2-tiny";
  auto save = [&](int ranks, const std::string& more, const fs::path& to) {
    ASSERT_EQ(run_memfit(fmt::format("train {} --save '{}'", args(more), to.string()), ranks), 0)
        << to << ": " << test::slurp(dir / "err.txt");
  };
  save(0, a, dir / "one");
  save(2, a + " --pp 2", dir / "pp2");
  // Two steps at --pp 2, then a resume at --pp 4 to four.
  save(2, a + " --pp 2 --stop-after 2", dir / "half");
  save(4, fmt::format("{} --pp 4 --resume '{}'", a, (dir / "half").string()), dir / "pp4");
  for (const char* f : {"adapter_model.safetensors", "adapter_optimizer.safetensors",
                        "model.safetensors", "adapter_config.json"}) {
    const std::string x = test::slurp(dir / "one" / f);
    ASSERT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == test::slurp(dir / "pp2" / f)) << f << " differs at --pp 2";
    EXPECT_TRUE(x == test::slurp(dir / "pp4" / f)) << f << " differs after a --pp 4 resume";
  }
}

TEST_F(LoraPipeline, ThePlanIsEveryStagesMeasuredPeak) {
  expect_plan_is_measured(2, std::string(kSteps) + " --pp 2");
  expect_plan_is_measured(
      4, std::string(kSteps) + " --pp 4 --pp-schedule gpipe --model gpt2-tiny");
  expect_plan_is_measured(4, std::string(kSteps) + " --pp 2 --ckpt full");
}

}  // namespace
}  // namespace memfit
