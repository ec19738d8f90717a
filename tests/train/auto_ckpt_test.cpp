// Training under --ckpt auto and --auto-batch: the run uses the planner's choice and its measured
// peak fits the budget (and equals the prediction), the checkpoint records the policy and the
// compression it ran with rather than "auto", a resume continues (keeping the compression, and
// refusing another); and an out-of-memory run writes no checkpoint while the planner's advice
// names options (compression among them) that, trained, do fit.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include <nlohmann/json.hpp>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/io/atomic_file.h"
#include "memfit/memory/pool.h"
#include "memfit/plan/fit_advice.h"
#include "memfit/plan/memory_plan.h"
#include "trainer_fixture.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class AutoTrain : public test::TrainerFixture {
 protected:
  // gpt2-tiny with 4 blocks and plain attention, and a budget halfway between --ckpt full and
  // --ckpt none: the planner has to recompute some blocks, not all.
  TrainConfig budgeted() const {
    TrainConfig c = config();
    c.n_layer = 4;
    c.attention = "plain";
    c.steps = 2;
    TrainConfig p = c;
    p.ckpt = "none";
    const size_t none = plan_training(resolve_run(p)).peak_bytes;
    p.ckpt = "full";
    const size_t full = plan_training(resolve_run(p)).peak_bytes;
    c.mem_limit = std::to_string(full + (none - full) / 2);
    return c;
  }
  static nlohmann::json state(const fs::path& dir) {
    return nlohmann::json::parse(io::read_file_to_string(dir / "trainer_state.json"));
  }
};

TEST_F(AutoTrain, RunsTheChoiceWithinTheBudgetAndRecordsItsPolicy) {
  TrainConfig c = budgeted();
  c.ckpt = "auto";
  c.save_dir = (dir / "auto").string();
  c.stop_after = 1;
  const SearchResult choice = plan_auto(c, resolve_run(c));
  ASSERT_TRUE(choice.fits);
  // Something must give: recomputation, or (--act-compress not given) compression.
  ASSERT_FALSE(choice.choice.ckpt == "none" && choice.choice.act_compress == ActCompress::none);
  const std::string compress(act_compress_name(choice.choice.act_compress));
  const TrainSummary s = train(c);
  const size_t limit = parse_bytes(c.mem_limit);
  EXPECT_LE(s.peak_bytes, limit);
  EXPECT_EQ(s.peak_bytes, choice.choice.peak_bytes);  // the planner's prediction, measured
  EXPECT_EQ(s.ckpt, choice.choice.ckpt);
  EXPECT_EQ(s.act_compress, compress);
  EXPECT_EQ(state(c.save_dir)["ckpt"], choice.choice.ckpt);  // not "auto"
  EXPECT_EQ(state(c.save_dir)["act_compress"], compress);

  // The same command resumes: the search is a function of the config, and the trainer does not
  // need the policy to match anyway (every policy gives the same gradients).
  TrainConfig more = c;
  more.stop_after = 0;
  more.resume_dir = c.save_dir;
  const TrainSummary r = train(more);
  EXPECT_EQ(r.steps_run, 1);
  EXPECT_EQ(r.last_step, 2);
  EXPECT_EQ(state(c.save_dir)["step"], 2);
  EXPECT_EQ(state(c.save_dir)["ckpt"], choice.choice.ckpt);
  EXPECT_EQ(r.act_compress, compress) << "a resume keeps the checkpoint's compression";
}

TEST_F(AutoTrain, AutoBatchKeepsTheGlobalBatch) {
  TrainConfig c = budgeted();
  c.auto_batch = true;  // --ckpt none: the micro-batch is what may change
  c.save_dir = (dir / "ab").string();
  const TrainSummary s = train(c);
  EXPECT_EQ(s.batch * s.grad_accum, c.batch * c.grad_accum);
  EXPECT_LT(s.batch, c.batch);  // at 4 rows --ckpt none does not fit
  EXPECT_EQ(s.ckpt, "none");
  EXPECT_LE(s.peak_bytes, parse_bytes(c.mem_limit));
  EXPECT_EQ(state(c.save_dir)["batch"], s.batch);
  EXPECT_EQ(state(c.save_dir)["grad_accum"], s.grad_accum);
}

TEST_F(AutoTrain, AResumeUnderAutoBatchKeepsTheCheckpointsMicroBatch) {
  TrainConfig c = config();
  c.batch = 2;
  c.grad_accum = 4;
  c.steps = 2;
  c.stop_after = 1;
  c.save_dir = (dir / "saved").string();
  train(c);
  TrainConfig more = c;
  more.stop_after = 0;
  more.resume_dir = c.save_dir;
  more.auto_batch = true;
  more.mem_limit = "1GiB";
  // A fresh run would take one row at a time (as fast, and smaller) ...
  TrainConfig fresh = more;
  fresh.resume_dir.clear();
  ASSERT_EQ(plan_auto(fresh, resolve_run(fresh)).choice.batch, 1);
  // ... but the resumed one keeps 2 x 4, or the trainer would refuse it.
  std::string note;
  EXPECT_EQ(plan_auto(more, resolve_run(more), &note).choice.batch, 2);
  EXPECT_NE(note.find("checkpoint"), std::string::npos) << note;
  const TrainSummary r = train(more);
  EXPECT_EQ(r.batch, 2);
  EXPECT_EQ(r.grad_accum, 4);
  EXPECT_EQ(r.last_step, 2);
  // Another global batch cannot be the same run.
  more.batch = 4;
  EXPECT_THROW(plan_auto(more, resolve_run(more)), ConfigError);
}

TEST_F(AutoTrain, AutoWithoutMemLimitIsAConfigError) {
  TrainConfig c = config();
  c.ckpt = "auto";
  c.save_dir = (dir / "never").string();
  try {
    train(c);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--mem-limit"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir / "never"));
}

TEST_F(AutoTrain, OutOfMemoryWritesNoCheckpointAndTheAdviceFits) {
  TrainConfig c = budgeted();  // --ckpt none, over the budget
  c.save_dir = (dir / "oom").string();
  const size_t limit = parse_bytes(c.mem_limit);
  try {
    train(c);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_FALSE(fs::exists(dir / "oom"));
    const OutOfMemoryError advised = with_fit_advice(e, resolve_run(c));
    EXPECT_STREQ(advised.what(), e.what());  // the pool's message and live breakdown stay
    const std::string text = advised.advice();
    const FitAdvice advice = advise_fit(resolve_run(c), limit);
    ASSERT_FALSE(advice.options.empty()) << advice.text();
    EXPECT_GT(advice.planned, limit);
    for (const FitOption& o : advice.options) {
      SCOPED_TRACE(o.change);
      EXPECT_NE(text.find(o.change), std::string::npos) << text;
      // Trained as advised, the run fits, at the predicted peak.
      // The options the advice names, given to the config.
      TrainConfig fixed = c;
      fixed.ckpt = o.run.ckpt.name();
      fixed.batch = o.run.batch;
      fixed.grad_accum = o.run.grad_accum;
      fixed.precision = std::string(precision_name(o.run.precision.precision));
      fixed.optim.name = o.run.optim.name;
      fixed.act_compress = act_compress_name(o.run.act_compress);
      fixed.grad_dtype = o.run.grad_dtype == DType::bf16 ? "bf16" : "fp32";
      fixed.master_weights = o.run.precision.master_weights ? "fp32" : "none";
      fixed.steps = 1;
      fixed.save_dir = (dir / "fixed").string();
      const TrainSummary s = train(fixed);
      EXPECT_LE(s.peak_bytes, limit);
      EXPECT_EQ(s.peak_bytes, o.plan.peak_bytes);
    }
    // The single levers are there: a checkpoint policy alone, and the micro-batch alone.
    auto has = [&](const std::string& prefix, const std::string& alone) {
      for (const FitOption& o : advice.options)
        if (o.change.starts_with(prefix) && o.change.find(alone) == std::string::npos) return true;
      return false;
    };
    EXPECT_TRUE(has("--ckpt ", "--batch")) << advice.text();
    EXPECT_TRUE(has("--batch ", "--ckpt")) << advice.text();
  }
}

TEST_F(AutoTrain, AdviceNamesCompressionWhereItMakesTheRunFit) {
  TrainConfig c = config();
  c.n_layer = 4;
  c.steps = 1;
  c.save_dir = (dir / "oom").string();  // planned with its save (the writer's staging)
  TrainConfig p = c;
  p.act_compress = "int8";
  const size_t int8 = plan_training(resolve_run(p)).peak_bytes;
  const size_t none = plan_training(resolve_run(c)).peak_bytes;
  ASSERT_LT(int8, none);
  const size_t limit = int8 + (none - int8) / 2;
  c.mem_limit = std::to_string(limit);
  EXPECT_THROW(train(c), OutOfMemoryError);
  const FitAdvice advice = advise_fit(resolve_run(c), limit);
  EXPECT_NE(advice.levers.find("activation compression"), std::string::npos) << advice.levers;
  // Compression alone fits (and nothing smaller does), so it is named alone.
  const FitOption* alone = nullptr;
  for (const FitOption& o : advice.options)
    if (o.change == "--act-compress int8") alone = &o;
  ASSERT_NE(alone, nullptr) << advice.text();
  EXPECT_EQ(alone->plan.peak_bytes, int8);
  // Trained as advised, it fits at the predicted peak.
  c.act_compress = "int8";
  const TrainSummary s = train(c);
  EXPECT_EQ(s.peak_bytes, int8);
  EXPECT_EQ(s.act_compress, "int8");
  // A resumed run keeps its compression, so the advice does not offer it.
  TrainConfig resumed = config();
  resumed.n_layer = 4;
  resumed.resume_dir = c.save_dir;
  resumed.steps = 2;
  EXPECT_EQ(advise_fit(resolve_run(resumed), limit).levers.find("compression"), std::string::npos);
}

TEST_F(AutoTrain, AResumeKeepsTheCheckpointsCompressionAndRefusesAnother) {
  TrainConfig c = config();
  c.act_compress = "fp8";
  c.steps = 2;
  c.stop_after = 1;
  c.save_dir = (dir / "saved").string();
  EXPECT_EQ(train(c).act_compress, "fp8");
  EXPECT_EQ(state(c.save_dir)["act_compress"], "fp8");
  TrainConfig more = c;
  more.stop_after = 0;
  more.resume_dir = c.save_dir;
  more.act_compress = "int8";
  try {
    train(more);
    FAIL() << "a resume with another compression ran";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("act_compress"), std::string::npos) << e.what();
  }
  EXPECT_EQ(state(c.save_dir)["step"], 1) << "the checkpoint is intact";
  more.act_compress.clear();  // not given: the checkpoint's
  const RunSpec spec = resolve_run(more);
  EXPECT_EQ(spec.act_compress, ActCompress::fp8);
  EXPECT_FALSE(spec.act_compress_open);
  const TrainSummary r = train(more);
  EXPECT_EQ(r.act_compress, "fp8");
  EXPECT_EQ(r.last_step, 2);
  EXPECT_EQ(state(c.save_dir)["act_compress"], "fp8");
}

TEST_F(AutoTrain, NothingFitsAdviceGivesTheSmallestFootprint) {
  TrainConfig c = config();
  c.save_dir = (dir / "never").string();
  c.mem_limit = "1MiB";
  EXPECT_THROW(train(c), OutOfMemoryError);
  EXPECT_FALSE(fs::exists(dir / "never"));
  const FitAdvice advice = advise_fit(resolve_run(c), 1 << 20);
  EXPECT_TRUE(advice.options.empty());
  EXPECT_NE(advice.text().find("nothing fits"), std::string::npos) << advice.text();
  // No lever goes lower than every lever at once with the 8-bit optimizer's least footprint.
  TrainConfig all = c;
  all.optim.name = "adamw8bit";
  const SearchResult r = search_training(resolve_run(all), 1 << 20, {true, true});
  EXPECT_LE(advice.smallest.plan.peak_bytes, r.smallest.peak_bytes);
  EXPECT_GT(advice.smallest.plan.peak_bytes, size_t(1) << 20);
}

}  // namespace
}  // namespace memfit
