// --update-in-backward with the optimizer offloaded (Note [Update in backward], "With offload"):
// each unit's state read, stepped and written back as its backward ends, no gradient file. With
// --clip 0 (and --clip-mode unit, and global clipping's two passes) the losses, the logged
// gradient norms and the saved checkpoint are the same bytes as the same run with the state in
// RAM, for both families, AdamW, 8-bit AdamW and APOLLO-mini, fp32, bf16 with master weights and
// pure bf16, with the working weights offloaded too; a stopped and resumed run ends with the
// uninterrupted one's files; the planner's peak by category, its files and its bytes moved per
// step are the measured ones, and it moves fewer bytes than the step after the backward with the
// gradients on disk; --offload-grads is refused, saying why.
#include <gtest/gtest.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/optim/backward_update.h"
#include "memfit/plan/memory_plan.h"
#include "trainer_fixture.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class BackwardUpdateOffload : public test::TrainerFixture {
 protected:
  TrainConfig base(const char* model = "gpt2-tiny") const {
    TrainConfig c = config(model);
    c.grad_accum = 1;
    c.clip = 0;
    c.steps = 3;
    c.eval_every = 2;  // an evaluation between steps (offloaded weights: reads left in flight)
    c.eval_batches = 1;
    c.update_in_backward = true;
    return c;
  }
  TrainConfig offloaded(TrainConfig c, bool params) const {
    c.offload_optimizer = "nvme";
    if (params) c.offload_params = "nvme";
    c.offload_dir = (dir / "offload").string();
    return c;
  }
  // The same --update-in-backward run with the state in RAM and offloaded (the optimizer; and
  // with `params` the working weights too): the same bytes.
  void expect_same_run(const TrainConfig& c, bool params, const std::string& what) {
    SCOPED_TRACE(what + (params ? " (--offload-params)" : ""));
    TrainConfig a = c, b = offloaded(c, params);
    a.save_dir = (dir / "ram").string();
    a.log_file = (dir / "ram.jsonl").string();
    b.save_dir = (dir / "off").string();
    b.log_file = (dir / "off.jsonl").string();
    const TrainSummary ram = train(a);
    const TrainSummary off = train(b);
    ASSERT_EQ(ram.losses.size(), static_cast<size_t>(c.steps));
    ASSERT_EQ(ram.losses.size(), off.losses.size());
    for (size_t i = 0; i < ram.losses.size(); ++i)
      EXPECT_EQ(ram.losses[i], off.losses[i]) << "step " << i + 1;
    EXPECT_EQ(ram.last_val_loss, off.last_val_loss);
    std::vector<nlohmann::json> norms[2];
    for (int k = 0; k < 2; ++k)
      for (const auto& line : read_log(dir / (k ? "off.jsonl" : "ram.jsonl")))
        if (line.contains("grad_norm")) norms[k].push_back(line["grad_norm"]);
    ASSERT_EQ(norms[0].size(), static_cast<size_t>(c.steps));
    EXPECT_EQ(norms[0], norms[1]);
    expect_same_checkpoint(dir / "ram", dir / "off");
    // The state left RAM; the gradients are the unit buffers, no file.
    EXPECT_EQ(off.peak_by_category[static_cast<size_t>(Category::optimizer)] > 0,
              c.optim.name == "apollo-mini");  // APOLLO's scratch stays in RAM
    EXPECT_EQ(off.peak_by_category[static_cast<size_t>(Category::master)], 0u);
    EXPECT_EQ(off.peak_by_category[static_cast<size_t>(Category::grads)],
              BackwardUpdate::grads_bytes(ParamLayout(resolve_run(b).model)));
    EXPECT_FALSE(fs::exists(dir / "offload"));  // scratch, removed with the directory it made
    fs::remove_all(dir / "ram");
    fs::remove_all(dir / "off");
  }
};

TEST_F(BackwardUpdateOffload, ClipZeroBitIdenticalBothFamilies) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"})
    for (const char* optim : {"adamw", "adamw8bit", "apollo-mini"})
      for (const char* precision : {"fp32", "bf16"}) {
        TrainConfig c = base(model);
        c.optim.name = optim;
        c.precision = precision;
        for (const bool params : {false, true})
          expect_same_run(c, params, fmt::format("{} {} {}", model, optim, precision));
      }
}

TEST_F(BackwardUpdateOffload, PureBf16FullCheckpointingBitIdentical) {
  // The 7B headline's configuration at a small shape: no master weights, so the working
  // weights are the weights of record, stepped in the slot the backward read them into.
  for (const char* model : {"llama-tiny", "gpt2-tiny"})
    for (const char* optim : {"adamw8bit", "apollo-mini"}) {
      TrainConfig c = base(model);
      c.optim.name = optim;
      c.precision = "bf16";
      c.master_weights = "none";
      c.ckpt = "full";
      for (const bool params : {false, true})
        expect_same_run(c, params, fmt::format("{} {} pure bf16", model, optim));
    }
  TrainConfig c = base("llama-tiny");  // recomputed segments between the stepped blocks
  c.precision = "bf16";
  c.master_weights = "none";
  c.ckpt = "every:2";
  c.prefetch_depth = 0;  // one slot: the next block's read waits for the write back
  expect_same_run(c, true, "--ckpt every:2 --prefetch-depth 0");
  c.prefetch_depth = 2;
  expect_same_run(c, true, "--ckpt every:2 --prefetch-depth 2");
}

TEST_F(BackwardUpdateOffload, UnitAndGlobalClippingBitIdentical) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
    TrainConfig c = base(model);
    c.optim.name = "adamw8bit";
    c.precision = "bf16";
    c.clip = 0.05f;  // acts on every step: global clipping's two passes
    expect_same_run(c, true, fmt::format("{} global clipping", model));
    c.clip_mode = "unit";
    expect_same_run(c, true, fmt::format("{} --clip-mode unit", model));
  }
}

TEST_F(BackwardUpdateOffload, StoppedAndResumedIsBitIdentical) {
  TrainConfig c = offloaded(base("llama-tiny"), true);
  c.steps = 6;
  c.precision = "bf16";
  c.master_weights = "none";
  c.optim.name = "adamw8bit";
  c.save_dir = (dir / "whole").string();
  train(c);
  // Stopped after 3, resumed offloaded in the backward, and resumed by the ordinary offloaded
  // step (the files' state is the same).
  for (const bool resume_ordinary : {false, true}) {
    SCOPED_TRACE(resume_ordinary ? "resumed ordinary" : "resumed in backward");
    TrainConfig s = c;
    s.save_dir = (dir / (resume_ordinary ? "b" : "a")).string();
    s.stop_after = 3;
    train(s);
    TrainConfig r = s;
    r.stop_after = 0;
    r.resume_dir = s.save_dir;
    r.update_in_backward = !resume_ordinary;
    train(r);
    expect_same_checkpoint(dir / "whole", s.save_dir);
  }
}

TEST_F(BackwardUpdateOffload, PlannedPeakFilesAndIoEqualMeasured) {
  struct Shape {
    const char* model;
    const char* precision;
    const char* master;
    bool params;
    float clip;
  };
  for (const Shape& k : {Shape{"gpt2-tiny", "bf16", "fp32", false, 0.0f},
                         Shape{"llama-tiny", "bf16", "none", true, 0.0f},
                         Shape{"gpt2-tiny", "fp32", "fp32", true, 0.05f},
                         Shape{"llama-tiny", "bf16", "fp32", true, 0.0f}}) {
    SCOPED_TRACE(fmt::format("{} {} master {} params {} clip {}", k.model, k.precision, k.master,
                             k.params, k.clip));
    TrainConfig c = offloaded(base(k.model), k.params);
    c.precision = k.precision;
    c.master_weights = k.master;
    c.clip = k.clip;
    c.optim.name = "adamw8bit";
    c.ckpt = "full";
    c.steps = 2;
    c.log_file = (dir / "log.jsonl").string();
    fs::remove(dir / "log.jsonl");
    const PlanReport plan = plan_training(resolve_run(c));
    const TrainSummary s = train(c);
    EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
    for (Category cat : kAllCategories)
      EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                s.peak_by_category[static_cast<size_t>(cat)])
          << category_name(cat);
    EXPECT_EQ(plan.disk_by_category[static_cast<size_t>(Category::grads)], 0u);
    int steps = 0;
    for (const auto& line : read_log(dir / "log.jsonl"))
      if (line.contains("offload") && line.contains("step")) {
        ++steps;
        EXPECT_EQ(line["offload"]["read_bytes"].get<uint64_t>() +
                      line["offload"]["written_bytes"].get<uint64_t>(),
                  plan.io_bytes_per_step);
        if (k.params) {
          EXPECT_EQ(line["offload"]["params"]["read_bytes"].get<uint64_t>(),
                    plan.param_read_bytes);
          EXPECT_EQ(line["offload"]["params"]["written_bytes"].get<uint64_t>(),
                    plan.param_written_bytes);
        }
      }
    EXPECT_EQ(steps, 2);
  }
}

TEST_F(BackwardUpdateOffload, MovesFewerBytesThanTheGradientFile) {
  // Everything on disk, pure bf16 (the 7B headline's options at a small shape): the ordinary
  // step writes and reads back every gradient and reads every block again for the update; in
  // the backward neither.
  TrainConfig c = offloaded(base("llama-tiny"), true);
  c.n_layer = 8;
  c.precision = "bf16";
  c.master_weights = "none";
  c.optim.name = "adamw8bit";
  c.ckpt = "full";
  TrainConfig ordinary = c;
  ordinary.update_in_backward = false;
  ordinary.offload_grads = "nvme";
  const PlanReport before = plan_training(resolve_run(ordinary));
  const PlanReport after = plan_training(resolve_run(c));
  const uint64_t P = static_cast<uint64_t>(ParamLayout(after.model).total());
  // The gradient file's 8 bytes a parameter (written, read) and the update's read of the bf16
  // blocks are gone; the optimizer's files and the blocks' reads and write remain.
  EXPECT_LT(after.io_bytes_per_step + 8 * P, before.io_bytes_per_step);
  EXPECT_LT(after.param_read_bytes, before.param_read_bytes);
  EXPECT_EQ(after.param_written_bytes, before.param_written_bytes);
  EXPECT_LT(after.disk_bytes, before.disk_bytes);  // no gradient file
  EXPECT_LT(after.peak_bytes, before.peak_bytes);  // one unit slot against the file's buffers
  // A low-state optimizer moves less again.
  c.optim.name = "apollo-mini";
  EXPECT_LT(plan_training(resolve_run(c)).io_bytes_per_step, after.io_bytes_per_step);
}

TEST_F(BackwardUpdateOffload, RefusesTheGradientFileSayingWhy) {
  TrainConfig c = offloaded(base(), false);
  c.offload_grads = "nvme";
  try {
    resolve_auto(c);
    FAIL() << "accepted --offload-grads nvme with --update-in-backward";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    for (const char* w : {"--offload-grads", "--update-in-backward", "no gradient file"})
      EXPECT_NE(m.find(w), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(dir / "offload"));
}

}  // namespace
}  // namespace memfit
