// memfit train --lora-rank (Note [LoRA]): a LoRA run at two shapes of each family plans exactly
// the peak it measures, category by category; its save holds the base weights bit for bit as
// they were loaded (--init-from) and the adapters in PEFT's format, which changed; and what is
// not built is refused before anything is built, naming the option; with --lora-dropout too,
// planned == measured and a resume bit for bit.
#include <gtest/gtest.h>

#include <string>

#include <fmt/format.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/core/error.h"
#include "memfit/io/checkpoint/lora_adapter.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/plan/memory_plan.h"
#include "lora_trainer_util.h"
#include "trainer_fixture.h"
#include "../io/io_test_util.h"

namespace memfit {
namespace {

class LoraTrainer : public test::TrainerFixture {};

TEST_F(LoraTrainer, PlannedPeakEqualsMeasuredAtTwoShapesOfEachFamily) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"})
    for (const auto& [batch, accum, rank, dropout] :
         {std::tuple{4, 1, 4, 0.0f}, std::tuple{2, 2, 8, 0.0f}, std::tuple{2, 2, 8, 0.1f}}) {
      SCOPED_TRACE(fmt::format("{} batch {} accum {} rank {} dropout {}", model, batch, accum,
                               rank, dropout));
      TrainConfig c = config(model);
      c.batch = batch;
      c.grad_accum = accum;
      c.steps = 2;
      c.eval_every = 0;
      c.lora.rank = rank;
      c.lora.dropout = dropout;
      c.lora.targets = std::string(model) == "gpt2-tiny" ? "attn,mlp_proj" : "all-linear";
      const PlanReport plan = plan_training(resolve_run(c));
      const TrainSummary s = train(c);
      EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
      for (Category cat : kAllCategories)
        EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                  s.peak_by_category[static_cast<size_t>(cat)])
            << category_name(cat);
      EXPECT_GT(plan.by_category[static_cast<size_t>(Category::grads)], 0u);
      EXPECT_LT(plan.by_category[static_cast<size_t>(Category::grads)],
                plan.by_category[static_cast<size_t>(Category::params)] / 10);
    }
}

TEST_F(LoraTrainer, SaveKeepsTheBaseBitsAndWritesChangedPeftAdapters) {
  TrainConfig base = config("llama-tiny");
  base.steps = 1;
  base.eval_every = 0;
  base.save_dir = (dir / "base").string();
  train(base);
  TrainConfig c = config();
  c.model.clear();
  c.init_from = base.save_dir;
  c.steps = 3;
  c.eval_every = 0;
  c.lora.rank = 4;
  c.lora.targets = "q,v";
  c.save_dir = (dir / "lora").string();
  const TrainSummary s = train(c);
  EXPECT_TRUE(std::isfinite(s.last_loss));
  EXPECT_EQ(io::testing::first_difference(dir / "base" / "model.safetensors",
                                          dir / "lora" / "model.safetensors"),
            "");
  io::SafetensorsReader r(dir / "lora" / io::kAdapterModelFile);
  EXPECT_EQ(r.entries().size(), 2u * 2 * 2);  // llama-tiny's 2 layers, q and v, A and B
  MemoryPool pool;
  const auto& e = r.at("base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  Tensor b = Tensor::empty(pool, {e.shape[0], e.shape[1]}, DType::f32, Category::staging, "b");
  r.read(e, b);
  double sum = 0;
  for (int64_t i = 0; i < b.numel(); ++i) sum += std::abs(b.data<float>()[i]);
  EXPECT_GT(sum, 0) << "B starts at zero and must have moved";
  EXPECT_TRUE(std::filesystem::exists(dir / "lora" / io::kAdapterConfigFile));
}

TEST_F(LoraTrainer, RefusesWhatIsNotBuiltNamingTheOption) {
  auto refused = [&](TrainConfig c, const char* needle) {
    c.lora.rank = 4;
    try {
      resolve_run(c);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  TrainConfig c = config();
  TrainConfig fp16 = c;  // bf16 is built (lora_bf16_trainer_test.cpp); fp16 is not
  fp16.precision = "fp16";
  refused(fp16, "--precision fp16");
  // ZeRO 1-2 and the optimizer offloaded: refused saying why (Note [LoRA], "ZeRO and offload";
  // the base alone offloaded is built: lora_offload_test.cpp);
  // under two ranks in tests/cli/lora_data_parallel_test.cpp. Stage 3 is built
  // (tests/cli/lora_zero3_test.cpp; in one process every stage is stage 0).
  for (int stage = 1; stage <= 2; ++stage) {
    TrainConfig zero = c;
    zero.zero = stage;
    refused(zero, fmt::format("--zero {} with --lora-rank is not built", stage).c_str());
  }
  TrainConfig three = c;
  three.zero = 3;
  three.lora.rank = 4;
  EXPECT_NO_THROW(resolve_run(three));
  TrainConfig params = c;
  params.offload_optimizer = params.offload_params = "nvme";
  params.offload_dir = (dir / "off").string();
  refused(params, "--offload-optimizer with --lora-rank is not built");
  TrainConfig off = c;
  off.offload_optimizer = "nvme";
  off.offload_dir = (dir / "off").string();
  refused(off, "--offload");
  TrainConfig drop = c;
  drop.lora.dropout = 1.0f;  // a probability below 1 (0.1 is built)
  refused(drop, "--lora-dropout");
  TrainConfig names = c;
  names.lora.targets = "q,v";  // LLaMA's names on GPT-2
  refused(names, "attn,proj,fc,mlp_proj");
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

class LoraResume : public test::TrainerFixture {};

// Two steps, a save, then --resume to four: the adapters, their optimizer state and the base
// weights are byte for byte those of four steps in one go; a resume without the LoRA options,
// or with others, is refused.
TEST_F(LoraResume, ResumeIsBitIdenticalToOneRun) {
  TrainConfig c = config("llama-tiny");
  c.steps = 4;
  c.eval_every = 0;
  c.lora.rank = 4;
  c.lora.targets = "q,v,down";
  test::expect_lora_resume_matches_one_run(dir, c, 2, [&](const std::filesystem::path& split) {
    // Without the LoRA options: the base optimizer's state is missing (the save has the
    // adapters'), which the load reports before trainer_state.json's LoRA check; with other
    // LoRA options, that check.
    TrainConfig plain = config("llama-tiny");
    plain.steps = 4;
    plain.resume_dir = split.string();
    EXPECT_THROW(train(plain), Error);
    TrainConfig other = c;
    other.lora.alpha = 32;
    other.resume_dir = split.string();
    try {
      train(other);
      ADD_FAILURE() << "a LoRA checkpoint resumed with another alpha";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--lora-rank"), std::string::npos) << e.what();
    }
  });
}

// --lora-dropout: the masks are drawn from (seed, step, micro-batch) alone, so a resume
// continues bit for bit with nothing saved; and the dropout is in effect (the adapters differ
// from a run without it).
TEST_F(LoraResume, ResumeWithDropoutIsBitIdenticalToOneRun) {
  TrainConfig c = config("gpt2-tiny");
  c.steps = 4;
  c.grad_accum = 2;
  c.eval_every = 2;  // evaluation (without dropout) between the steps changes nothing
  c.lora.rank = 4;
  c.lora.dropout = 0.3f;
  TrainConfig none = c;
  none.lora.dropout = 0;
  none.save_dir = (dir / "none").string();
  train(none);
  TrainConfig whole = c;
  whole.save_dir = (dir / "whole").string();
  train(whole);
  TrainConfig first = c;
  first.stop_after = 2;
  first.save_dir = (dir / "split").string();
  train(first);
  TrainConfig second = c;
  second.resume_dir = second.save_dir = first.save_dir;
  train(second);
  for (const char* f : {io::kAdapterModelFile, io::kAdapterOptimizerFile, "model.safetensors"})
    EXPECT_EQ(io::testing::first_difference(dir / "whole" / f, dir / "split" / f), "") << f;
  EXPECT_NE(io::testing::first_difference(dir / "whole" / io::kAdapterModelFile,
                                          dir / "none" / io::kAdapterModelFile),
            "");
}

}  // namespace
}  // namespace memfit
