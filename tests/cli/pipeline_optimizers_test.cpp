// Every optimizer and --act-compress under --pp, end to end under mpirun (Note [Pipeline
// parallel], "Optimizers" and "Compressed activations"): each stage steps its own whole
// parameters with the optimizer's own state over the stage's layout, so where the optimizer's
// sums are per parameter (every one memfit has: 8-bit and 4-bit blocks, Adam-mini's heads and
// rows, APOLLO's and GaLore's projections are all inside one tensor) LLaMA (untied) cut into 2
// and 4 stages gives one process's losses, gradient norms and validation losses with the same
// --grad-accum bit for bit; APOLLO draws each matrix's projection by its index in the whole
// model, and pure bf16 rounds by whole-model element indices. Each stage compresses its own
// blocks' saved activations, as one process does block by block. The plan is every world
// rank's measured peak by category. Skips where memfit was built without MPI.
#include "pipeline_test_util.h"

namespace memfit {
namespace {

using nlohmann::json;

class PipelineOptimizers : public test::PipelineBinaryTest {
 protected:
  PipelineOptimizers() : PipelineBinaryTest(4345) {}
};

// Four micro-batches, clipping that binds (the norm over every stage decides it), a validation
// loss every two steps.
constexpr const char* kSteps =
    "--steps 4 --grad-accum 4 --clip 0.05 --eval-every 2 --eval-batches 2";

TEST_F(PipelineOptimizers, EveryOptimizerGivesOneProcesssNumbersBitForBit) {
  for (const char* optim : {"adamw8bit", "lion", "lion8bit", "adamw4bit", "adam-mini", "apollo",
                            "apollo-mini", "galore", "galore8bit"}) {
    const std::string a = fmt::format("{} --optim {}", kSteps, optim);
    expect_close(train(0, a, "one"), train(2, a + " --pp 2", "pp2"),
                 {"loss", "grad_norm", "val_loss"}, 0, fmt::format("--pp 2 --optim {}", optim));
  }
  // Four stages under GPipe; pure bf16 (stochastic rounding by whole-model indices).
  for (const char* more : {"--optim adam-mini --pp-schedule gpipe",
                           "--optim adamw8bit --precision bf16 --master-weights none",
                           "--optim apollo --precision bf16 --master-weights none"}) {
    const std::string a = fmt::format("{} {}", kSteps, more);
    expect_close(train(0, a, "one"), train(4, a + " --pp 4", "pp4"),
                 {"loss", "grad_norm", "val_loss"}, 0, fmt::format("--pp 4 {}", more));
  }
}

// Stages of tensor groups (Note [Pipeline parallel], "Stages of tensor groups"): Adam-mini's
// row-parallel rows take their sums over each stage's tensor group, as under --tp alone; within
// --tp's tolerance of one process (the group's sums add in another order).
TEST_F(PipelineOptimizers, AdamMiniOverStagesOfTensorGroupsMatchesOneProcess) {
  const std::string a = std::string(kSteps) + " --optim adam-mini";
  expect_close(train(0, a, "one"), train(4, a + " --pp 2 --tp 2", "pp2tp2"),
               {"loss", "grad_norm", "val_loss"}, 3e-6, "--pp 2 --tp 2 --optim adam-mini");
}

TEST_F(PipelineOptimizers, CompressedActivationsGiveOneProcesssNumbersBitForBit) {
  for (const char* compress : {"int8", "fp8"}) {
    const std::string a = fmt::format("{} --act-compress {}", kSteps, compress);
    expect_close(train(0, a, "one"), train(2, a + " --pp 2", "pp2"),
                 {"loss", "grad_norm", "val_loss"}, 0, fmt::format("--pp 2 --act-compress {}", compress));
  }
  const std::string a = std::string(kSteps) + " --act-compress int8 --ckpt full";
  expect_close(train(0, a, "one"), train(4, a + " --pp 4 --pp-schedule gpipe", "pp4"),
               {"loss", "grad_norm", "val_loss"}, 0, "--pp 4 --act-compress int8 --ckpt full");
}

// Every world rank's measured peak is its stage's plan, by category: the optimizer's state
// over the stage's layout (quantised blocks, Adam-mini's v, APOLLO's scratch), the compressed
// saved activations.
TEST_F(PipelineOptimizers, ThePlanIsEveryRanksMeasuredPeak) {
  for (const auto& [ranks, more] : std::vector<std::pair<int, std::string>>{
           {2, "--pp 2 --pp-layers 2,2 --optim adamw8bit"},
           {2, "--pp 2 --pp-layers 2,2 --optim adamw4bit"},
           {2, "--pp 2 --pp-layers 2,2 --optim adam-mini"},
           {2, "--pp 2 --pp-layers 2,2 --optim apollo"},
           {4, "--pp 4 --pp-layers 1,1,1,1 --optim galore8bit"},
           {2, "--pp 2 --pp-layers 2,2 --act-compress int8"},
           {4, "--pp 2 --pp-layers 2,2 --zero 1 --optim adamw8bit --act-compress fp8"}})
    expect_plan_is_measured(ranks, "--steps 2 --grad-accum 4 " + more);
}

}  // namespace
}  // namespace memfit
