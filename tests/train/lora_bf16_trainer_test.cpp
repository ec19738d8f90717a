// memfit train --lora-rank --precision bf16 (Note [LoRA], "bf16"): the frozen base in bf16 with
// no master weights, the adapters f32 with their optimizer. The planned peak equals the
// measured one category by category at two shapes of each family (the base's bf16 bytes, no
// master category, the adapters' state, the widening scratch in the workspace arena), it
// composes with activation compression, and a resume continues bit for bit.
#include <gtest/gtest.h>

#include <string>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/train/trainer.h"
#include "lora_trainer_util.h"
#include "trainer_fixture.h"

namespace memfit {
namespace {

class LoraBf16Trainer : public test::TrainerFixture {};

TEST_F(LoraBf16Trainer, PlannedPeakEqualsMeasuredAtTwoShapesOfEachFamily) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"})
    for (const auto& [batch, accum, rank, dropout] :
         {std::tuple{4, 1, 4, 0.0f}, std::tuple{10, 2, 8, 0.0f}, std::tuple{10, 2, 8, 0.2f}}) {
      SCOPED_TRACE(fmt::format("{} batch {} accum {} rank {} dropout {}", model, batch, accum,
                               rank, dropout));
      TrainConfig c = config(model);
      c.precision = "bf16";
      c.batch = batch;  // 10 x 32 = 320 rows: two chunks of the adapters' widening
      c.grad_accum = accum;
      c.steps = 2;
      c.eval_every = 0;
      c.lora.rank = rank;
      c.lora.dropout = dropout;  // with dropout its chunk of the dropped input, "ws.lora.xd"
      c.lora.targets = std::string(model) == "gpt2-tiny" ? "attn,fc" : "all-linear";
      const RunSpec spec = resolve_run(c);
      EXPECT_FALSE(spec.precision.master_weights);
      const PlanReport plan = plan_training(spec);
      const TrainSummary s = train(c);
      EXPECT_TRUE(std::isfinite(s.last_loss));
      EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
      for (Category cat : kAllCategories)
        EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                  s.peak_by_category[static_cast<size_t>(cat)])
            << category_name(cat);
      EXPECT_EQ(plan.by_category[static_cast<size_t>(Category::master)], 0u);
      // The base in bf16: 2 bytes a parameter, besides the adapters' f32 weights.
      const size_t adapters = plan.by_category[static_cast<size_t>(Category::grads)];
      EXPECT_EQ(plan.by_category[static_cast<size_t>(Category::params)] - adapters,
                MemoryPool::round_up(static_cast<size_t>(spec.model.num_params()) * 2));
    }
}

// Activation compression (Note [Activation compression]) composes with LoRA: the saved
// activations in int8 or fp8 with their scales, planned == measured by category, fewer
// activation bytes than without, and the loss within int8's rounding of the uncompressed run's.
TEST_F(LoraBf16Trainer, ComposesWithActivationCompression) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
    SCOPED_TRACE(model);
    TrainConfig c = config(model);
    c.precision = "bf16";
    c.batch = 4;
    c.steps = 2;
    c.eval_every = 0;
    c.lora.rank = 4;
    c.lora.targets = "all-linear";
    c.act_compress = "none";
    const PlanReport plain = plan_training(resolve_run(c));
    const TrainSummary ref = train(c);
    for (const char* codes : {"int8", "fp8"}) {
      SCOPED_TRACE(codes);
      c.act_compress = codes;
      const PlanReport plan = plan_training(resolve_run(c));
      const TrainSummary s = train(c);
      EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
      for (Category cat : kAllCategories)
        EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                  s.peak_by_category[static_cast<size_t>(cat)])
            << category_name(cat);
      EXPECT_LT(plan.by_category[static_cast<size_t>(Category::activations)],
                plain.by_category[static_cast<size_t>(Category::activations)]);
      EXPECT_NEAR(s.last_loss, ref.last_loss, 2e-2 * ref.last_loss);
      EXPECT_NE(s.last_loss, ref.last_loss);  // the codes are what the backward read
    }
  }
}

TEST_F(LoraBf16Trainer, ResumeIsBitIdenticalToOneRun) {
  TrainConfig c = config("llama-tiny");
  c.precision = "bf16";
  c.steps = 4;
  c.eval_every = 0;
  c.lora.rank = 4;
  c.lora.targets = "q,v,down";
  test::expect_lora_resume_matches_one_run(dir, c);
}

}  // namespace
}  // namespace memfit
