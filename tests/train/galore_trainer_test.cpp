// GaLore through the trainer (Note [GaLore] in docs/notes/galore.md): the planner's peak is the
// pool's, category by category, fp32 and bf16, in RAM and offloaded; the offloaded run is the
// run in RAM bit for bit; a resume continues bit for bit (the projector is state, saved in the
// checkpoint: the resumed step uses the saved one, not a new SVD); another rank or projection
// gap is refused.
#include <gtest/gtest.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/plan/memory_plan.h"
#include "trainer_fixture.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class GaloreTrainer : public test::TrainerFixture {
 protected:
  TrainConfig galore(const char* name, const char* model = "gpt2-tiny") const {
    TrainConfig c = config(model);
    c.optim.name = name;
    c.optim.proj_gap = 2;  // new projectors within the run (steps 1 and 3)
    c.optim.rank = 16;
    c.steps = 4;
    c.eval_batches = 1;
    return c;
  }
  void expect_plan_is_measured(const TrainConfig& c, const std::string& what) {
    SCOPED_TRACE(what);
    const PlanReport plan = plan_training(resolve_run(c));
    const TrainSummary s = train(c);
    EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
    for (Category cat : kAllCategories)
      EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                s.peak_by_category[static_cast<size_t>(cat)])
          << category_name(cat);
    EXPECT_GT(s.peak_by_category[static_cast<size_t>(Category::optimizer)], 0u);
    ASSERT_GE(s.losses.size(), 2u);
    EXPECT_LT(s.losses.back(), s.losses.front());  // it learns
  }
};

TEST_F(GaloreTrainer, PlannedPeakEqualsMeasuredFp32Bf16AndOffloaded) {
  TrainConfig fp32 = galore("galore");
  fp32.steps = 3;
  expect_plan_is_measured(fp32, "gpt2-tiny fp32 galore rank 16");
  TrainConfig q8 = galore("galore8bit", "llama-tiny");
  q8.steps = 3;
  q8.precision = "bf16";
  q8.optim.rank = 0;  // 128, capped at each matrix's smaller side
  expect_plan_is_measured(q8, "llama-tiny bf16 galore8bit default rank");
  TrainConfig bf16 = galore("galore", "llama-tiny");
  bf16.steps = 3;
  bf16.precision = "bf16";
  bf16.optim.rank = 8;
  expect_plan_is_measured(bf16, "llama-tiny bf16 galore rank 8");
  TrainConfig off = galore("galore8bit");
  off.steps = 3;
  off.precision = "bf16";
  off.offload_optimizer = "nvme";
  off.offload_dir = (dir / "offload").string();
  expect_plan_is_measured(off, "gpt2-tiny bf16 galore8bit offloaded");
}

// GaLore updates f32 weights of record: pure bf16 (no master copy) is refused before the run.
TEST_F(GaloreTrainer, PureBf16WeightsAreRefused) {
  TrainConfig pure = galore("galore8bit", "llama-tiny");
  pure.precision = "bf16";
  pure.master_weights = "none";
  try {
    train(pure);
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("got galore8bit"), std::string::npos) << e.what();
  }
}

TEST_F(GaloreTrainer, OffloadedIsTheRunInRamBitForBit) {
  for (const char* name : {"galore", "galore8bit"}) {
    SCOPED_TRACE(name);
    TrainConfig c = galore(name);
    c.steps = 3;
    c.save_dir = (dir / name / "ram").string();
    const TrainSummary ram = train(c);
    c.offload_optimizer = "nvme";
    c.offload_dir = (dir / name / "offload").string();
    c.save_dir = (dir / name / "off").string();
    const TrainSummary off = train(c);
    ASSERT_EQ(ram.losses.size(), 3u);
    EXPECT_EQ(ram.losses, off.losses);
    expect_same_checkpoint(dir / name / "ram", dir / name / "off");
  }
}

TEST_F(GaloreTrainer, ResumeIsBitIdenticalAndChecksTheProjection) {
  for (const char* name : {"galore", "galore8bit"}) {
    SCOPED_TRACE(name);
    TrainConfig whole = galore(name);
    whole.save_dir = (dir / name / "whole").string();
    const TrainSummary a = train(whole);
    TrainConfig first = galore(name);
    first.save_dir = (dir / name / "half").string();
    first.stop_after = 3;  // step 3 made the second projector; step 4 must read it back
    train(first);
    TrainConfig second = galore(name);
    second.resume_dir = first.save_dir;
    second.save_dir = first.save_dir;
    const TrainSummary b = train(second);
    ASSERT_EQ(b.losses.size(), 1u);
    EXPECT_EQ(a.losses[3], b.losses[0]);
    expect_same_checkpoint(dir / name / "whole", dir / name / "half");
    TrainConfig other_gap = second;
    other_gap.optim.proj_gap = 3;
    EXPECT_THROW(train(other_gap), ConfigError);
    TrainConfig other_rank = second;
    other_rank.optim.rank = 2;  // refused by the state's shapes before trainer_state.json
    EXPECT_THROW(train(other_rank), Error);
  }
}

}  // namespace
}  // namespace memfit
