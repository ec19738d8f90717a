// memfit train --precision fp8 (Note [FP8], docs/notes/fp8.md) end to end on gpt2-tiny and
// llama-tiny: the loss falls over a few steps, the planner's peak equals the measured one
// category by category at two shapes of each family (the blocks' linears stored as FP8, one
// byte a weight), a resume is bit-identical to one run, and
// what is not built is refused before anything is built, naming the option.
#include <gtest/gtest.h>

#include <string>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/core/error.h"
#include "memfit/model/fp8_weights.h"
#include "memfit/plan/memory_plan.h"
#include "trainer_fixture.h"

namespace memfit {
namespace {

class Fp8Trainer : public test::TrainerFixture {
 protected:
  TrainConfig fp8(const char* model = "gpt2-tiny") const {
    TrainConfig c = config(model);
    c.precision = "fp8";
    return c;
  }
};

TEST_F(Fp8Trainer, TheLossFallsInEachFamily) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(model);
    TrainConfig c = fp8(model);
    c.steps = 20;
    c.eval_every = 0;
    const TrainSummary s = train(c);
    ASSERT_EQ(s.losses.size(), 20u);
    for (float l : s.losses) ASSERT_TRUE(std::isfinite(l));
    EXPECT_LT(s.losses.back(), s.losses.front() - 1.0f);
  }
}

TEST_F(Fp8Trainer, PlannedPeakEqualsMeasuredAtTwoShapesOfEachFamily) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"})
    for (const auto& [batch, accum, ckpt] :
         {std::tuple{4, 1, "none"}, std::tuple{2, 2, "full"}}) {
      SCOPED_TRACE(fmt::format("{} batch {} accum {} ckpt {}", model, batch, accum, ckpt));
      TrainConfig c = fp8(model);
      c.batch = batch;
      c.grad_accum = accum;
      c.ckpt = ckpt;
      c.steps = 2;
      c.eval_every = 0;
      const PlanReport plan = plan_training(resolve_run(c));
      const TrainSummary s = train(c);
      EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
      for (Category cat : kAllCategories)
        EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                  s.peak_by_category[static_cast<size_t>(cat)])
            << category_name(cat);
      // bf16's plan of the same run, for the FP8 operand buffers' bytes and the stored
      // weights (Note [FP8], "Storage"): more workspace; the working slab without the blocks'
      // linears, which take one byte a weight (and a scale a matrix) instead of two.
      TrainConfig b = c;
      b.precision = "bf16";
      const PlanReport bf = plan_training(resolve_run(b));
      const ParamLayout layout(plan.model);
      int64_t compact = 0;
      (void)layout.compact_offsets(&compact);
      EXPECT_EQ(plan.by_category[static_cast<size_t>(Category::params)],
                MemoryPool::round_up(static_cast<size_t>(compact) * 2) +
                    MemoryPool::round_up(Fp8WeightLayout(layout).bytes()));
      EXPECT_LT(plan.by_category[static_cast<size_t>(Category::params)],
                bf.by_category[static_cast<size_t>(Category::params)]);
      EXPECT_GT(plan.by_category[static_cast<size_t>(Category::workspace)],
                bf.by_category[static_cast<size_t>(Category::workspace)]);
    }
}

// Three steps, a save, then --resume to six: losses, weights and optimizer state byte for byte
// those of six steps in one go (current scaling keeps no amax history to save).
TEST_F(Fp8Trainer, ResumeIsBitIdenticalToOneRun) {
  TrainConfig whole = fp8("llama-tiny");
  whole.save_dir = (dir / "whole").string();
  const TrainSummary a = train(whole);
  ASSERT_EQ(a.losses.size(), 6u);
  TrainConfig first = fp8("llama-tiny");
  first.save_dir = (dir / "split").string();
  first.stop_after = 3;
  const TrainSummary b = train(first);
  TrainConfig second = fp8("llama-tiny");
  second.resume_dir = second.save_dir = first.save_dir;
  const TrainSummary c = train(second);
  ASSERT_EQ(b.losses.size(), 3u);
  ASSERT_EQ(c.losses.size(), 3u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(a.losses[i], b.losses[i]) << "step " << i + 1;
    EXPECT_EQ(a.losses[3 + i], c.losses[i]) << "step " << i + 4;
  }
  expect_same_checkpoint(dir / "whole", dir / "split");
  // The checkpoint records fp8: resuming it in bf16 is refused like any other precision change.
  TrainConfig other = config("llama-tiny");
  other.precision = "bf16";
  other.resume_dir = first.save_dir;
  other.steps = 7;
  EXPECT_THROW(train(other), ConfigError);
}

TEST_F(Fp8Trainer, RefusesWhatIsNotBuiltNamingTheOption) {
  auto refused = [&](TrainConfig c, const char* needle) {
    try {
      resolve_run(c);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TrainConfig lora = fp8();
  lora.lora.rank = 4;
  refused(lora, "--lora-rank");
  TrainConfig pure = fp8();
  pure.master_weights = "none";
  refused(pure, "--master-weights none");
}

}  // namespace
}  // namespace memfit
