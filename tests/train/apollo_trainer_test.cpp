// APOLLO through the trainer (Note [APOLLO] in docs/notes/apollo.md): the planner's peak is the
// pool's, category by category, in RAM and offloaded; the offloaded run is the run in RAM bit
// for bit; a resume continues bit for bit (the projections are drawn again from the seed, never
// saved); a resume with another rank or projection gap is refused.
#include <gtest/gtest.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/plan/memory_plan.h"
#include "trainer_fixture.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class ApolloTrainer : public test::TrainerFixture {
 protected:
  TrainConfig apollo(const char* name, const char* model = "gpt2-tiny") const {
    TrainConfig c = config(model);
    c.optim.name = name;
    c.optim.proj_gap = 2;  // new projections within the run, and across the resume below
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

TEST_F(ApolloTrainer, PlannedPeakEqualsMeasuredInRamAndOffloaded) {
  TrainConfig mini = apollo("apollo-mini");
  mini.steps = 2;
  expect_plan_is_measured(mini, "gpt2-tiny fp32 apollo-mini");
  TrainConfig full = apollo("apollo", "llama-tiny");
  full.steps = 2;
  full.precision = "bf16";
  full.optim.rank = 16;
  expect_plan_is_measured(full, "llama-tiny bf16 apollo rank 16");
  // The headline's configuration: bf16 weights of record, no master copy, apollo-mini.
  TrainConfig pure = apollo("apollo-mini", "llama-tiny");
  pure.steps = 3;
  pure.precision = "bf16";
  pure.master_weights = "none";
  expect_plan_is_measured(pure, "llama-tiny pure bf16 apollo-mini");
  TrainConfig off = mini;
  off.precision = "bf16";
  off.offload_optimizer = "nvme";
  off.offload_dir = (dir / "offload").string();
  expect_plan_is_measured(off, "gpt2-tiny bf16 apollo-mini offloaded");
}

TEST_F(ApolloTrainer, OffloadedIsTheRunInRamBitForBit) {
  for (const char* name : {"apollo-mini", "apollo"}) {
    SCOPED_TRACE(name);
    TrainConfig c = apollo(name);
    c.steps = 3;
    c.save_dir = (dir / "ram").string();
    const TrainSummary ram = train(c);
    c.offload_optimizer = "nvme";
    c.offload_dir = (dir / "offload").string();
    c.save_dir = (dir / "off").string();
    const TrainSummary off = train(c);
    ASSERT_EQ(ram.losses.size(), 3u);
    EXPECT_EQ(ram.losses, off.losses);
    expect_same_checkpoint(dir / "ram", dir / "off");
  }
}

TEST_F(ApolloTrainer, ResumeIsBitIdenticalAndChecksTheProjection) {
  TrainConfig whole = apollo("apollo-mini");
  whole.save_dir = (dir / "whole").string();
  const TrainSummary a = train(whole);
  TrainConfig first = apollo("apollo-mini");
  first.save_dir = (dir / "half").string();
  first.stop_after = 3;  // the resume starts inside the second projection window
  train(first);
  TrainConfig second = apollo("apollo-mini");
  second.resume_dir = first.save_dir;
  second.save_dir = first.save_dir;
  const TrainSummary b = train(second);
  ASSERT_EQ(b.losses.size(), 1u);
  EXPECT_EQ(a.losses[3], b.losses[0]);
  expect_same_checkpoint(dir / "whole", dir / "half");
  TrainConfig other_gap = second;
  other_gap.optim.proj_gap = 3;
  EXPECT_THROW(train(other_gap), ConfigError);
  TrainConfig other_rank = second;
  other_rank.optim.rank = 2;  // refused by the state's shapes before trainer_state.json
  EXPECT_THROW(train(other_rank), Error);
}

}  // namespace
}  // namespace memfit
