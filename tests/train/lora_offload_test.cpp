// memfit train --lora-rank --offload-params nvme (Note [LoRA], "The frozen base on disk"): the
// frozen base's blocks in a file, each read before the phases that need it and never written
// after the set-up; the adapters and their optimizer in RAM. Against the same LoRA run in RAM
// (fp32 in both families, bf16 LLaMA): every loss, the validation loss and the save (the base,
// the adapters, their optimizer state) are the same bytes. The planned peak by category, the
// file and the I/O per step are the measured ones, no byte is written in a step, and the save's
// base (streamed from the file after training) is the --init-from checkpoint's byte for byte; a
// resume continues bit for bit; --ckpt auto with --offload-dir alone puts the base on disk where
// only that fits; what does not compose is refused naming the options.
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include <fmt/format.h>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/core/error.h"
#include "memfit/io/checkpoint/lora_adapter.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/plan/search.h"
#include "lora_trainer_util.h"
#include "trainer_fixture.h"
#include "../io/io_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class LoraOffload : public test::TrainerFixture {
 protected:
  TrainConfig lora(const char* model, const char* precision) const {
    TrainConfig c = config(model);
    c.precision = precision;
    c.lora.rank = 4;
    c.lora.targets = "all-linear";
    c.steps = 4;
    c.eval_every = 2;  // an evaluation between steps leaves prefetched reads behind
    c.eval_batches = 1;
    return c;
  }
  TrainConfig offloaded(TrainConfig c) const {
    c.offload_params = "nvme";
    c.offload_dir = (dir / "offload").string();
    return c;
  }
  // A LoRA save: the base, the adapters, their optimizer state, the configs, the trainer state.
  static void expect_same_lora_save(const fs::path& a, const fs::path& b) {
    for (const char* f : {"model.safetensors", "config.json", "trainer_state.json",
                          io::kAdapterModelFile, io::kAdapterOptimizerFile,
                          "adapter_config.json"}) {
      EXPECT_TRUE(fs::exists(a / f) && fs::exists(b / f)) << f;
      EXPECT_EQ(io::testing::first_difference(a / f, b / f), "") << f;
    }
  }
  // A base model to start from, saved in `precision` (bf16 as pure bf16, so the save is bf16).
  fs::path save_base(const char* model, const char* precision) const {
    TrainConfig b = config(model);
    b.precision = precision;
    if (std::string(precision) == "bf16") b.master_weights = "none";
    b.steps = 1;
    b.eval_every = 0;
    b.save_dir = (dir / fmt::format("base-{}-{}", model, precision)).string();
    fs::remove_all(b.save_dir);
    train(b);
    return b.save_dir;
  }
};

TEST_F(LoraOffload, BitIdenticalToTheSameRunInRam) {
  for (const auto& [model, precision, ckpt, dropout] :
       {std::tuple{"gpt2-tiny", "fp32", "none", 0.0f},
        std::tuple{"llama-tiny", "fp32", "none", 0.1f},
        std::tuple{"llama-tiny", "bf16", "full", 0.0f}}) {
    SCOPED_TRACE(fmt::format("{} {} --ckpt {} dropout {}", model, precision, ckpt, dropout));
    TrainConfig c = lora(model, precision);
    c.ckpt = ckpt;
    c.lora.dropout = dropout;
    c.save_dir = (dir / "ram").string();
    fs::remove_all(c.save_dir);
    const TrainSummary ram = train(c);
    TrainConfig o = offloaded(c);
    o.save_dir = (dir / "off").string();
    fs::remove_all(o.save_dir);
    const TrainSummary off = train(o);
    ASSERT_EQ(ram.losses.size(), 4u);
    ASSERT_EQ(off.losses.size(), 4u);
    for (size_t i = 0; i < ram.losses.size(); ++i)
      EXPECT_EQ(ram.losses[i], off.losses[i]) << "step " << i + 1;
    EXPECT_NE(ram.losses.front(), ram.losses.back());  // the adapters learned something
    EXPECT_EQ(ram.last_val_loss, off.last_val_loss);
    expect_same_lora_save(dir / "ram", dir / "off");
    // The blocks left RAM: params holds the embeddings, the tail and the adapters.
    const auto params = static_cast<size_t>(Category::params);
    EXPECT_LT(off.peak_by_category[params], ram.peak_by_category[params]);
    EXPECT_FALSE(fs::exists(dir / "offload"));  // scratch, removed with the directory it made
  }
}

TEST_F(LoraOffload, PlannedEqualsMeasuredNothingWrittenAndTheBaseSavedAsLoaded) {
  for (const auto& [model, precision] :
       {std::tuple{"gpt2-tiny", "fp32"}, std::tuple{"llama-tiny", "fp32"},
        std::tuple{"llama-tiny", "bf16"}}) {
    SCOPED_TRACE(fmt::format("{} {}", model, precision));
    const fs::path base = save_base(model, precision);
    TrainConfig c = offloaded(lora(model, precision));
    c.model.clear();
    c.init_from = base.string();
    c.steps = 2;
    c.eval_every = 0;
    c.log_file = (dir / "log.jsonl").string();
    c.save_dir = (dir / "lora").string();
    fs::remove_all(c.save_dir);
    const PlanReport plan = plan_training(resolve_run(c));
    const TrainSummary s = train(c);
    EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
    for (Category cat : kAllCategories)
      EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                s.peak_by_category[static_cast<size_t>(cat)])
          << category_name(cat);
    // The base's file alone on disk; each step reads its blocks and writes nothing.
    EXPECT_GT(plan.disk_by_category[static_cast<size_t>(Category::params)], 0u);
    EXPECT_EQ(plan.disk_bytes, plan.disk_by_category[static_cast<size_t>(Category::params)]);
    EXPECT_GT(plan.param_read_bytes, 0u);
    EXPECT_EQ(plan.param_written_bytes, 0u);
    EXPECT_EQ(plan.io_bytes_per_step, plan.param_read_bytes);
    int steps = 0;
    for (const auto& line : read_log(dir / "log.jsonl"))
      if (line.contains("offload") && line.contains("step")) {
        ++steps;
        EXPECT_EQ(line["offload"]["read_bytes"].get<uint64_t>(), plan.param_read_bytes);
        EXPECT_EQ(line["offload"]["written_bytes"].get<uint64_t>(), 0u);
        EXPECT_EQ(line["offload"]["params"]["written_bytes"].get<uint64_t>(), 0u);
      }
    EXPECT_EQ(steps, 2);
    // Streamed from the file after the steps: the base as it was loaded, byte for byte.
    EXPECT_EQ(io::testing::first_difference(base / "model.safetensors",
                                            dir / "lora" / "model.safetensors"),
              "");
  }
}

TEST_F(LoraOffload, ResumeIsBitIdenticalToOneRun) {
  for (const auto& [model, precision] :
       {std::tuple{"gpt2-tiny", "fp32"}, std::tuple{"llama-tiny", "bf16"}}) {
    SCOPED_TRACE(fmt::format("{} {}", model, precision));
    TrainConfig c = offloaded(lora(model, precision));
    c.eval_every = 0;
    c.lora.dropout = 0.2f;
    test::expect_lora_resume_matches_one_run(dir / model, c);
  }
}

TEST_F(LoraOffload, SearchOffloadsTheBaseWhereOnlyThatFits) {
  TrainConfig c = lora("llama-tiny", "bf16");
  c.n_layer = 8;  // enough blocks that the file saves more than the ring costs
  c.steps = 2;
  c.eval_every = 0;
  c.ckpt = "full";
  c.offload_dir = (dir / "offload").string();
  const size_t in_ram = plan_memory(resolve_run(c)).peak_bytes;
  const size_t on_disk = plan_memory(resolve_run(offloaded(c))).peak_bytes;
  ASSERT_LT(on_disk, in_ram);
  // --offload-dir alone: the search may put the base on disk (never the adapters' optimizer,
  // nor gradients the base does not have); under this budget only that fits.
  const size_t limit = (on_disk + in_ram) / 2;
  c.ckpt = "auto";
  c.mem_limit = std::to_string(limit);
  const AutoResolution r = resolve_auto(c);
  EXPECT_TRUE(r.search.choice.offload_params);
  EXPECT_FALSE(r.search.choice.offload);
  EXPECT_FALSE(r.search.choice.offload_grads);
  EXPECT_TRUE(r.spec().offload.params && !r.spec().offload.optimizer);
  const std::string options = candidate_options(r.search.choice, false);
  EXPECT_NE(options.find("--offload-params nvme"), std::string::npos) << options;
  EXPECT_EQ(options.find("--offload-optimizer"), std::string::npos) << options;
  const TrainSummary s = train(c);
  EXPECT_LE(s.peak_bytes, limit);
  EXPECT_EQ(s.peak_bytes, plan_memory(r.spec()).peak_bytes);
  // A roomier budget keeps the base in RAM (as fast, no file).
  c.mem_limit = std::to_string(in_ram + (size_t{64} << 20));
  EXPECT_FALSE(resolve_auto(c).search.choice.offload_params);
}

TEST_F(LoraOffload, RefusesWhatDoesNotComposeNamingTheOptions) {
  auto refused = [&](TrainConfig c, const char* needle) {
    try {
      resolve_run(c);
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const TrainConfig c = offloaded(lora("llama-tiny", "fp32"));
  EXPECT_NO_THROW(resolve_run(c));
  TrainConfig opt = c;  // the adapters' optimizer stays in RAM
  opt.offload_optimizer = "nvme";
  refused(opt, "--offload-optimizer with --lora-rank is not built");
  TrainConfig grads = c;
  grads.offload_grads = "nvme";
  refused(grads, "--offload-grads with --lora-rank");
  TrainConfig no_dir = c;
  no_dir.offload_dir.clear();
  refused(no_dir, "--offload-params nvme keeps the blocks' weights in a file, so it needs "
                  "--offload-dir");
  TrainConfig nf4 = c;
  nf4.lora.base = LoraBase::nf4;
  refused(nf4, "--base-dtype nf4 with --offload-params is not built");
  // Over ranks at stage 0 every rank would hold the whole file; stage 3 (each rank's shard) is
  // built (tests/cli/lora_zero3_test.cpp).
  TrainConfig ranks = c;
  ranks.ranks = 2;
  refused(ranks, "--offload-params with --lora-rank under 2 ranks at --zero 0");
  ranks.zero = 3;
  EXPECT_NO_THROW(resolve_run(ranks));
}

}  // namespace
}  // namespace memfit
