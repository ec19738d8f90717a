// The fit advice for a LoRA run (Note [LoRA], "bf16"): its bf16 lever keeps the frozen base in
// bf16 alone (run_precision: no master weights), so an fp32 LoRA run over a budget between its
// bf16 and fp32 footprints is told "--precision bf16" and the advised run plans within the budget
// (before, the lever kept the master weights, which LoRA refuses, and was skipped); over ranks
// the ZeRO stage is no lever (LoRA runs at stage 0).
#include <gtest/gtest.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/plan/fit_advice.h"
#include "memfit/plan/memory_plan.h"

namespace memfit {
namespace {

TEST(LoraFitAdvice, TheBf16LeverKeepsTheBaseWithoutMasterWeights) {
  TrainConfig c;
  c.model = "gpt2";
  c.seq_len = 64;
  c.batch = 1;
  c.steps = 0;
  c.ckpt = "none";
  c.lora.rank = 8;
  const RunSpec fp32 = resolve_run(c);
  c.precision = "bf16";
  const RunSpec bf16 = resolve_run(c);
  EXPECT_FALSE(bf16.precision.master_weights);
  const size_t big = plan_training(fp32).peak_bytes, small = plan_training(bf16).peak_bytes;
  ASSERT_LT(small, big * 3 / 4);
  const size_t limit = (small + big) / 2;
  const FitAdvice a = advise_fit(fp32, limit);
  EXPECT_FALSE(a.fits_as_is);
  bool bf16_advised = false;
  for (const FitOption& o : a.options) {
    EXPECT_LE(o.plan.peak_bytes, limit) << o.change;
    if (o.run.precision.precision == Precision::bf16) {
      bf16_advised = true;
      EXPECT_FALSE(o.run.precision.master_weights) << o.change;
      EXPECT_NE(o.change.find("--precision bf16"), std::string::npos) << o.change;
    }
  }
  EXPECT_TRUE(bf16_advised) << a.text();
}

// Over data-parallel ranks LoRA runs at stage 0 alone (Note [LoRA], "ZeRO and offload"): the
// advice over two ranks names no ZeRO stage, and still advises bf16.
TEST(LoraFitAdvice, OverRanksTheStageIsNoLever) {
  TrainConfig c;
  c.model = "gpt2";
  c.seq_len = 64;
  c.batch = 1;
  c.steps = 0;
  c.ckpt = "none";
  c.lora.rank = 8;
  c.ranks = 2;
  const RunSpec fp32 = resolve_run(c);
  ASSERT_EQ(fp32.world, 2);
  c.precision = "bf16";
  const size_t big = plan_training(fp32).peak_bytes, small = plan_training(resolve_run(c)).peak_bytes;
  const FitAdvice a = advise_fit(fp32, (small + big) / 2);
  EXPECT_EQ(a.levers.find("ZeRO"), std::string::npos) << a.levers;
  ASSERT_FALSE(a.options.empty()) << a.text();
  for (const FitOption& o : a.options) {
    EXPECT_EQ(o.change.find("--zero"), std::string::npos) << o.change;
    EXPECT_EQ(o.run.zero, 0) << o.change;
  }
}

}  // namespace
}  // namespace memfit
