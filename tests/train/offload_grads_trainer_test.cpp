// Training with --offload-grads nvme (and the optimizer offloaded) against the same run in RAM
// with default flags (Note [NVMe offload], "Gradients on disk"): the losses, the gradient
// norms and the saved checkpoint are the same bytes with every optimizer family, clipping on the
// global norm, --grad-accum 1 and 2, fp32, bf16 and fp16 (its unscale and overflow check per
// unit); with --grad-dtype bf16, the same run with bf16 gradients in RAM; no gradient slab in
// RAM; the planner's peak by category, files and I/O per step are the measured ones.
#include <gtest/gtest.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/offload/offloaded_grads.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/plan/search.h"
#include "trainer_fixture.h"
#include "../io/io_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;


class OffloadGradsTrainer : public test::TrainerFixture {
 protected:
  TrainConfig offloaded(TrainConfig c) const {
    c.offload_optimizer = "nvme";
    c.offload_grads = "nvme";
    c.offload_dir = (dir / "offload").string();
    return c;
  }
  void expect_same_run(TrainConfig c, const std::string& what,
                       const std::string& offload_params = "none") {
    SCOPED_TRACE(what);
    c.steps = 3;
    c.eval_batches = 1;
    c.clip = 0.05f;  // small enough that clipping acts on every step
    c.save_dir = (dir / "ram").string();
    c.log_file = (dir / "ram.jsonl").string();
    const TrainSummary ram = train(c);
    TrainConfig o = offloaded(c);
    o.offload_params = offload_params;
    o.save_dir = (dir / "off").string();
    o.log_file = (dir / "off.jsonl").string();
    const TrainSummary off = train(o);
    ASSERT_EQ(ram.losses.size(), 3u);
    ASSERT_EQ(ram.losses.size(), off.losses.size());
    for (size_t i = 0; i < ram.losses.size(); ++i)
      EXPECT_EQ(ram.losses[i], off.losses[i]) << "step " << i + 1;
    // The global norm: the same per-unit sums of squares in the same order.
    std::vector<nlohmann::json> norms[2];  // null where fp16 skipped a step
    for (int k = 0; k < 2; ++k)
      for (const auto& line : read_log(dir / (k ? "off.jsonl" : "ram.jsonl")))
        if (line.contains("grad_norm")) norms[k].push_back(line["grad_norm"]);
    ASSERT_EQ(norms[0].size(), 3u);
    EXPECT_EQ(norms[0], norms[1]);
    expect_same_checkpoint(dir / "ram", dir / "off");
    // No slab: the gradients' RAM is the unit buffers (or the update's ring in them). (A tiny
    // model's embeddings dominate, so they are not smaller than its slab here:
    // OffloadedGradsLayout.Llama2_7bHoldsAFractionOfTheSlab.)
    const RunSpec spec = resolve_run(o);
    EXPECT_EQ(off.peak_by_category[static_cast<size_t>(Category::grads)],
              offload::make_grad_file_layout(ParamLayout(spec.model), o.grad_accum,
                                             spec.grad_dtype)
                  .ram_bytes());
    EXPECT_FALSE(fs::exists(dir / "offload"));  // scratch, removed, and the directory it made
  }
};

TEST_F(OffloadGradsTrainer, Fp32EveryOptimizerWithAccumulationBitIdentical) {
  for (const char* optim : {"adamw", "adamw8bit", "lion", "adam-mini"}) {
    TrainConfig c = config();  // --grad-accum 2: each block read back before its backward
    c.optim.name = optim;
    expect_same_run(c, std::string("fp32 ") + optim);
  }
}

TEST_F(OffloadGradsTrainer, WithoutAccumulationAndInBf16BitIdentical) {
  TrainConfig c = config();
  c.grad_accum = 1;
  expect_same_run(c, "fp32 adamw, --grad-accum 1");
  TrainConfig b = config();
  b.precision = "bf16";
  b.optim.name = "adamw8bit";
  expect_same_run(b, "bf16 adamw8bit");
  TrainConfig p = config("llama-tiny");
  p.precision = "bf16";
  p.master_weights = "none";
  expect_same_run(p, "llama-tiny pure bf16");
  p.optim.name = "adamw8bit";  // stochastic rounding of each 8-bit block's bf16 weights
  expect_same_run(p, "llama-tiny pure bf16, adamw8bit");
}

// With the working weights on disk too (--offload-params nvme): params, gradients and optimizer
// state all offloaded, the configuration of the 7B headline.
TEST_F(OffloadGradsTrainer, WithTheWorkingWeightsOffloadedBitIdentical) {
  for (const char* precision : {"fp32", "bf16"}) {
    TrainConfig c = config("llama-tiny");
    c.precision = precision;
    expect_same_run(c, std::string("with --offload-params, ") + precision, "nvme");
  }
}

// --grad-dtype bf16: the file holds the bf16 sums, and the run is the same run with bf16
// gradients in RAM, bit for bit (Note [Gradients in bf16]): each micro-batch rounded once, added
// to the sums so far read back in f32 and rounded once, the update widening each piece.
TEST_F(OffloadGradsTrainer, Bf16GradientsBitIdenticalToBf16GradientsInRam) {
  TrainConfig c = config();  // --grad-accum 2
  c.grad_dtype = "bf16";
  expect_same_run(c, "fp32, bf16 gradients, adamw");
  c.grad_accum = 1;
  c.optim.name = "adamw8bit";
  expect_same_run(c, "fp32, bf16 gradients, adamw8bit, --grad-accum 1");
  TrainConfig b = config();
  b.grad_dtype = "bf16";
  b.precision = "bf16";
  b.optim.name = "adamw8bit";
  expect_same_run(b, "bf16 with master weights, bf16 gradients, adamw8bit");
  TrainConfig p = config("llama-tiny");
  p.grad_dtype = "bf16";
  p.precision = "bf16";
  p.master_weights = "none";
  p.grad_accum = 1;
  expect_same_run(p, "llama-tiny pure bf16, bf16 gradients, adamw, --grad-accum 1");
  p.grad_accum = 2;
  p.optim.name = "adamw8bit";
  expect_same_run(p, "llama-tiny pure bf16, bf16 gradients, adamw8bit");
  // With the working weights on disk too: the headline's configuration.
  expect_same_run(p, "llama-tiny pure bf16, bf16 gradients, adamw8bit, --offload-params", "nvme");
  // fp16: each unit's bf16 sums unscaled in place before the write; a scale that overflows
  // skips the same steps.
  TrainConfig h = config();
  h.grad_dtype = "bf16";
  h.precision = "fp16";
  h.attention = "plain";  // flash is fp32/bf16 only
  h.loss_scaler.initial_scale = 16777216.0f;
  expect_same_run(h, "fp16, bf16 gradients, overflowing scale");
  int skipped = 0;
  for (const auto& line : read_log(dir / "off.jsonl"))
    if (line.contains("grad_norm") && line["grad_norm"].is_null()) ++skipped;
  EXPECT_GT(skipped, 0);
}

TEST_F(OffloadGradsTrainer, Fp16UnscalesPerUnitBitIdentical) {
  TrainConfig c = config();
  c.precision = "fp16";
  c.attention = "plain";  // flash is fp32/bf16 only
  expect_same_run(c, "fp16 adamw");
  // A scale that overflows: the same steps skipped (the overflow check per unit), the same
  // scale backed off.
  c.loss_scaler.initial_scale = 16777216.0f;  // 2^24, the largest allowed
  int skipped = 0;
  expect_same_run(c, "fp16 adamw, overflowing scale");
  for (const auto& line : read_log(dir / "off.jsonl"))
    if (line.contains("grad_norm") && line["grad_norm"].is_null()) ++skipped;
  EXPECT_GT(skipped, 0);
}

TEST_F(OffloadGradsTrainer, PlannedPeakFilesAndIoEqualMeasured) {
  // 4-6: the same with bf16 gradients (half the file, half the I/O).
  for (int accum : {1, 2, 3, 4, 5, 6}) {
    SCOPED_TRACE(accum);
    TrainConfig c = offloaded(config());
    c.precision = "bf16";
    c.grad_accum = (accum - 1) % 3 == 0 ? 1 : 2;
    if (accum % 3 == 0) c.offload_params = "nvme";  // with the working weights on disk too
    if (accum > 3) c.grad_dtype = "bf16";
    c.steps = 2;
    c.log_file = (dir / "log.jsonl").string();
    const PlanReport plan = plan_training(resolve_run(c));
    const TrainSummary s = train(c);
    EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
    for (Category cat : kAllCategories)
      EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                s.peak_by_category[static_cast<size_t>(cat)])
          << category_name(cat);
    const RunSpec spec = resolve_run(c);
    const offload::GradFileLayout g =
        offload::make_grad_file_layout(ParamLayout(spec.model), c.grad_accum, spec.grad_dtype);
    const offload::GradFileLayout f32 =
        offload::make_grad_file_layout(ParamLayout(spec.model), c.grad_accum);
    if (accum > 3) {  // the bf16 file is half the f32 one, but for the pages' rounding
      EXPECT_LT(g.file_bytes, f32.file_bytes / 2 + 64 * offload::kIoAlign);
      EXPECT_LT(plan.io_bytes_per_step, plan_training(resolve_run([&] {
                                          TrainConfig f = c;
                                          f.grad_dtype = "fp32";
                                          return f;
                                        }())).io_bytes_per_step);
    }
    EXPECT_EQ(plan.disk_by_category[static_cast<size_t>(Category::grads)], g.file_bytes);
    EXPECT_EQ(plan.by_category[static_cast<size_t>(Category::grads)], g.ram_bytes());
    int steps = 0;
    for (const auto& line : read_log(dir / "log.jsonl"))
      if (line.contains("offload")) {
        ++steps;
        EXPECT_EQ(line["offload"]["read_bytes"].get<uint64_t>() +
                      line["offload"]["written_bytes"].get<uint64_t>(),
                  plan.io_bytes_per_step);
      }
    EXPECT_EQ(steps, 2);
  }
}

TEST_F(OffloadGradsTrainer, RefusesWithoutTheOptimizerOffloaded) {
  TrainConfig c = config();
  c.offload_grads = "nvme";
  c.offload_dir = (dir / "offload").string();
  auto message = [&]() -> std::string {
    try {
      resolve_run(c);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "accepted";
  };
  EXPECT_NE(message().find("needs --offload-optimizer nvme"), std::string::npos) << message();
  c.offload_grads = "disk";
  EXPECT_NE(message().find("--offload-grads must be none or nvme"), std::string::npos)
      << message();
  // Several ranks: refused with the reason, at every stage.
  RunSpec spec = resolve_run(offloaded(config()));
  spec.world = 2;
  for (int stage : {1, 2, 3}) {
    spec.zero = stage;
    try {
      spec.check();
      ADD_FAILURE() << "accepted --offload-grads over 2 ranks at stage " << stage;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("--offload-grads nvme is for one process"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST_F(OffloadGradsTrainer, StoppedAndResumedIsBitIdentical) {
  // The checkpoint never needs the gradients' file: a run stopped after step 3 and resumed
  // (offloaded again, and in RAM) ends with the uninterrupted run's files.
  TrainConfig c = config();
  c.precision = "bf16";
  c.optim.name = "adamw8bit";
  c.save_dir = (dir / "whole").string();
  train(c);  // in RAM, straight through
  for (const bool back_in_ram : {false, true}) {
    SCOPED_TRACE(back_in_ram ? "resumed in RAM" : "resumed offloaded");
    TrainConfig o = offloaded(c);
    o.save_dir = (dir / (back_in_ram ? "ram" : "off")).string();
    o.stop_after = 3;
    train(o);
    TrainConfig r = back_in_ram ? c : o;
    r.save_dir = o.save_dir;
    r.stop_after = 0;
    r.resume_dir = o.save_dir;
    train(r);
    expect_same_checkpoint(dir / "whole", o.save_dir);
  }
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

// The search (--ckpt auto with --offload-dir, Note [NVMe offload], "Choosing offload") tries
// every offloaded candidate also with the gradients on disk, in one process, unless
// --offload-grads was given; under a budget only that meets, it chooses it, the run is built
// with it and its peak is the plan's. Over several ranks, or with --offload-grads none, never.
TEST_F(OffloadGradsTrainer, SearchKeepsTheGradientsOnDiskWhereOnlyThatFits) {
  TrainConfig c = config();
  c.n_layer = 16;  // enough blocks that the slab outweighs the unit buffers
  c.precision = "bf16";
  c.ckpt = "full";
  c.steps = 2;
  c.offload_dir = (dir / "offload").string();
  TrainConfig a = c;
  a.offload_optimizer = "nvme";
  a.offload_params = "nvme";
  a.offload_grads = "none";
  const size_t slab = plan_memory(resolve_run(a)).peak_bytes;
  a.offload_grads = "nvme";
  const size_t on_disk = plan_memory(resolve_run(a)).peak_bytes;
  ASSERT_LT(on_disk, slab);
  const size_t limit = (on_disk + slab) / 2;
  c.ckpt = "auto";
  c.mem_limit = std::to_string(limit);
  const AutoResolution r = resolve_auto(c);
  ASSERT_TRUE(r.search.fits) << r.search.message;
  EXPECT_TRUE(r.search.choice.offload && r.search.choice.offload_grads);
  EXPECT_TRUE(r.spec().offload.grads);
  EXPECT_NE(r.search.message.find("--offload-grads nvme"), std::string::npos) << r.search.message;
  for (const Candidate& k : r.search.candidates) {
    if (k.offload_grads) {
      EXPECT_TRUE(k.offload) << "gradients on disk without the optimizer";
    }
  }
  const TrainSummary s = train(c);
  EXPECT_LE(s.peak_bytes, limit);
  EXPECT_EQ(s.peak_bytes, plan_memory(r.spec()).peak_bytes);
  // A budget the run fits in RAM keeps the gradients there (never faster on disk: the same
  // compute and more I/O; at equal time the search keeps fewer things on disk).
  c.mem_limit = "10GiB";
  EXPECT_FALSE(resolve_auto(c).search.choice.offload_grads);
  // --offload-grads none: the search leaves them in RAM, and nothing fits this budget.
  c.mem_limit = std::to_string(limit);
  c.offload_grads = "none";
  RunSpec fixed = resolve_run(c);
  const SearchResult none = search_training(fixed, limit, SearchSpace::of(fixed));
  EXPECT_FALSE(none.fits);
  for (const Candidate& k : none.candidates) EXPECT_FALSE(k.offload_grads);
  // Over two ranks: offloaded candidates at stages 1-3, never with the gradients on disk.
  c.offload_grads = "";
  RunSpec ranks = resolve_run(c);
  ranks.world = 2;
  ranks.zero_auto = true;
  const SearchResult two = search_training(ranks, limit, SearchSpace::of(ranks));
  bool offloaded = false;
  for (const Candidate& k : two.candidates) {
    offloaded = offloaded || k.offload;
    EXPECT_FALSE(k.offload_grads);
  }
  EXPECT_TRUE(offloaded);
}

}  // namespace
}  // namespace memfit
