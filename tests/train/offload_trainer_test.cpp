// Training with --offload-optimizer nvme against the same run in RAM (Note [NVMe offload]):
// the losses and the saved checkpoint (weights of record and optimizer state) are the same
// bytes for every optimizer, fp32, bf16 with master weights and pure bf16, with gradient
// accumulation and clipping; a resume from an offloaded checkpoint continues bit for bit;
// the planner's peak is the pool's; a disk error mid-run stops with the file, the offset and
// errno and leaves the last checkpoint as it was.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <iterator>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/plan/memory_plan.h"
#include "trainer_fixture.h"
#include "../io/io_test_util.h"
#include "../support/scoped_env.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;


class OffloadTrainer : public test::TrainerFixture {
 protected:
  TrainConfig offloaded(TrainConfig c) const {
    c.offload_optimizer = "nvme";
    c.offload_dir = (dir / "offload").string();
    return c;
  }
  void expect_same_run(TrainConfig c, const std::string& what) {
    SCOPED_TRACE(what);
    c.steps = 3;
    c.eval_batches = 1;
    c.clip = 0.05f;  // small enough that clipping acts on every step
    c.save_dir = (dir / "ram").string();
    const TrainSummary ram = train(c);
    TrainConfig o = offloaded(c);
    o.save_dir = (dir / "off").string();
    const TrainSummary off = train(o);
    ASSERT_EQ(ram.losses.size(), 3u);
    ASSERT_EQ(ram.losses.size(), off.losses.size());
    for (size_t i = 0; i < ram.losses.size(); ++i)
      EXPECT_EQ(ram.losses[i], off.losses[i]) << "step " << i + 1;
    EXPECT_EQ(ram.last_val_loss, off.last_val_loss);
    expect_same_checkpoint(dir / "ram", dir / "off");
    // The state left RAM: no optimizer or master bytes in the pool, a ring in staging.
    EXPECT_EQ(off.peak_by_category[static_cast<size_t>(Category::optimizer)], 0u);
    EXPECT_EQ(off.peak_by_category[static_cast<size_t>(Category::master)], 0u);
    EXPECT_GT(off.peak_by_category[static_cast<size_t>(Category::staging)],
              ram.peak_by_category[static_cast<size_t>(Category::staging)]);
    // The scratch files are gone.
    EXPECT_FALSE(fs::exists(dir / "offload"));  // the directory the run made goes too
  }
};

TEST_F(OffloadTrainer, Fp32EveryOptimizerBitIdentical) {
  // (SGD and 8-bit Lion stream like the others: tests/offload covers them.)
  for (const char* optim : {"adamw", "adamw8bit", "lion", "adam-mini", "adamw4bit"}) {
    TrainConfig c = config();
    c.optim.name = optim;
    expect_same_run(c, std::string("fp32 ") + optim);
  }
}

TEST_F(OffloadTrainer, Bf16MasterWeightsBitIdentical) {
  for (const char* optim : {"adamw", "lion8bit", "adam-mini"}) {
    TrainConfig c = config();
    c.precision = "bf16";
    c.optim.name = optim;
    expect_same_run(c, std::string("bf16 ") + optim);
  }
}

TEST_F(OffloadTrainer, Bf16OptimizerStateBitIdentical) {
  TrainConfig c = config();
  c.precision = "bf16";
  c.optim.state_dtype = DType::bf16;  // --optim-state-dtype bf16
  expect_same_run(c, "bf16 adamw, bf16 moments");
}

TEST_F(OffloadTrainer, PureBf16AndLlamaBitIdentical) {
  TrainConfig c = config();
  c.precision = "bf16";
  c.master_weights = "none";
  expect_same_run(c, "pure bf16 adamw");
  TrainConfig l = config("llama-tiny");
  l.precision = "bf16";
  expect_same_run(l, "llama-tiny bf16 adamw");
}

TEST_F(OffloadTrainer, ThreadEngineBitIdentical) {
  const test::ScopedEnv env("MEMFIT_OFFLOAD_IO", "threads");
  TrainConfig c = config();
  c.precision = "bf16";
  expect_same_run(c, "threads, bf16 adamw");
}

TEST_F(OffloadTrainer, ResumeFromOffloadedCheckpointIsBitIdentical) {
  TrainConfig c = config();
  c.precision = "bf16";
  c.optim.name = "adamw8bit";
  c.save_dir = (dir / "whole").string();
  train(c);  // in RAM, straight through
  TrainConfig o = offloaded(c);
  o.save_dir = (dir / "split").string();
  o.stop_after = 3;
  train(o);
  o.stop_after = 0;
  o.resume_dir = o.save_dir;
  train(o);  // offloaded again, from the offloaded checkpoint
  expect_same_checkpoint(dir / "whole", dir / "split");
  // And a RAM run resumes from an offloaded checkpoint: the files are the same format.
  TrainConfig r = c;
  r.save_dir = (dir / "mixed").string();
  r.stop_after = 3;
  train(offloaded(r));
  r.stop_after = 0;
  r.resume_dir = r.save_dir;
  train(r);
  expect_same_checkpoint(dir / "whole", dir / "mixed");
}

TEST_F(OffloadTrainer, PlannedPeakEqualsMeasured) {
  for (const char* precision : {"fp32", "bf16"}) {
    TrainConfig c = offloaded(config());
    c.precision = precision;
    c.optim.name = "adamw8bit";
    c.steps = 2;
    const PlanReport plan = plan_training(resolve_run(c));
    const TrainSummary s = train(c);
    SCOPED_TRACE(precision);
    EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
    for (Category cat : kAllCategories)
      EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                s.peak_by_category[static_cast<size_t>(cat)])
          << category_name(cat);
    EXPECT_EQ(plan.by_category[static_cast<size_t>(Category::optimizer)], 0u);
    EXPECT_GT(plan.disk_by_category[static_cast<size_t>(Category::optimizer)], 0u);
    EXPECT_EQ(plan.disk_by_category[static_cast<size_t>(Category::master)] > 0,
              std::string(precision) == "bf16");
    EXPECT_GT(plan.io_bytes_per_step, plan.disk_bytes);  // read and written: about twice
    // The log's per-step I/O is the plan's.
  }
}

TEST_F(OffloadTrainer, LoggedIoIsThePlansPerStep) {
  TrainConfig c = offloaded(config());
  c.precision = "bf16";
  c.steps = 2;
  c.log_file = (dir / "log.jsonl").string();
  const PlanReport plan = plan_training(resolve_run(c));
  train(c);
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

TEST_F(OffloadTrainer, NeedsADirectory) {
  TrainConfig c = config();
  c.offload_optimizer = "nvme";
  try {
    resolve_run(c);
    FAIL() << "accepted --offload-optimizer nvme without --offload-dir";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--offload-dir"), std::string::npos) << e.what();
  }
  c.offload_optimizer = "disk";
  EXPECT_THROW(resolve_run(c), ConfigError);
  TrainConfig d = config();
  d.disk_limit = "1GiB";  // without offload
  EXPECT_THROW(resolve_run(d), ConfigError);
  d.offload_dir = (dir / "offload").string();  // a search may offload: the limit bounds it
  EXPECT_NO_THROW(resolve_run(d));
}

// --offload-dir without --offload-optimizer: --ckpt auto offloads only when nothing fits in RAM.
TEST_F(OffloadTrainer, AutoOffloadsOnlyWhenNothingFitsInRam) {
  TrainConfig c = config();
  c.n_layer = 8;  // deep enough that the state offloaded outweighs the ring of one block's
  c.precision = "bf16";
  c.steps = 2;
  c.ckpt = "auto";
  c.mem_limit = "10GiB";
  const SearchResult in_ram = plan_auto(c, resolve_run(c));  // no --offload-dir: RAM only
  ASSERT_TRUE(in_ram.fits);
  EXPECT_FALSE(in_ram.choice.offload);
  c.offload_dir = (dir / "offload").string();
  const AutoResolution roomy = resolve_auto(c);
  EXPECT_FALSE(roomy.search.choice.offload);  // as fast or faster in RAM
  EXPECT_FALSE(roomy.spec().offload.optimizer);
  // One byte less than the smallest run in RAM: only an offloaded one fits.
  c.mem_limit = std::to_string(in_ram.smallest.peak_bytes - 1);
  const AutoResolution tight = resolve_auto(c);
  ASSERT_TRUE(tight.search.fits);
  EXPECT_TRUE(tight.search.choice.offload);
  EXPECT_TRUE(tight.spec().offload.optimizer);
  EXPECT_NE(candidate_options(tight.search.choice, false).find("--offload-optimizer nvme"),
            std::string::npos);
  const TrainSummary s = train(c);
  EXPECT_LE(s.peak_bytes, in_ram.smallest.peak_bytes - 1);
  EXPECT_EQ(s.peak_by_category[static_cast<size_t>(Category::optimizer)], 0u);
  EXPECT_EQ(s.steps_run, 2);
  // A --disk-limit below the files: no offloaded candidate fits, and with the RAM limit too
  // tight for any other, nothing does; with room for the files the choice is offloaded again.
  c.disk_limit = "1KiB";
  EXPECT_FALSE(plan_auto(c, resolve_run(c)).fits);
  c.disk_limit = "100GiB";
  EXPECT_TRUE(plan_auto(c, resolve_run(c)).choice.offload);
  // A roomy RAM limit with a disk limit: the choice stays in RAM and runs without one.
  c.mem_limit = "10GiB";
  c.disk_limit = "1KiB";
  const AutoResolution in_ram_again = resolve_auto(c);
  EXPECT_FALSE(in_ram_again.search.choice.offload);
  EXPECT_EQ(in_ram_again.spec().offload.disk_limit, 0u);
}

TEST_F(OffloadTrainer, RefusesFilesLargerThanTheDiskLimit) {
  TrainConfig c = offloaded(config());
  c.disk_limit = "100KiB";
  try {
    train(c);
    FAIL() << "files larger than --disk-limit were accepted";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("--disk-limit 102400 bytes"), std::string::npos) << m;
    EXPECT_NE(m.find("need"), std::string::npos) << m;
  }
  EXPECT_FALSE(fs::exists(dir / "offload") && !fs::is_empty(dir / "offload"));
}

TEST_F(OffloadTrainer, IoErrorMidRunNamesFileOffsetErrnoAndKeepsLastCheckpoint) {
  for (const char* what : {"EIO", "ENOSPC", "short"}) {
    SCOPED_TRACE(what);
    TrainConfig c = offloaded(config());
    c.precision = "bf16";
    c.steps = 4;
    c.save_every = 1;
    c.save_dir = (dir / "ckpt").string();
    // gpt2-tiny has 4 units (embeddings, 2 blocks, tail) and bf16 AdamW 3 files (master, m,
    // v): 4 requests write the initial master weights, a step reads and writes every unit of
    // every file (24), a save reads them (12). Request 50 is in the second step's update,
    // after the first step's checkpoint. The setting differs each time, so counting restarts.
    std::string m = "no error";
    {
      const test::ScopedEnv fail("MEMFIT_OFFLOAD_FAIL_IO", fmt::format("50:{}", what));
      try {
        train(c);
      } catch (const IoError& e) {
        m = e.what();
      }
    }
    EXPECT_NE(m.find(".offload"), std::string::npos) << m;
    EXPECT_NE(m.find("offset"), std::string::npos) << m;
    if (std::string(what) == "EIO") { EXPECT_NE(m.find("errno 5"), std::string::npos) << m; }
    if (std::string(what) == "ENOSPC") { EXPECT_NE(m.find("errno 28"), std::string::npos) << m; }
    if (std::string(what) == "short") { EXPECT_NE(m.find("short"), std::string::npos) << m; }
    // The last checkpoint is whole, and resumes.
    const auto state = nlohmann::json::parse(io::testing::read_file(dir / "ckpt" / "trainer_state.json"));
    EXPECT_GE(state["step"].get<int>(), 1);
    EXPECT_LT(state["step"].get<int>(), 4);
    EXPECT_FALSE(fs::exists(dir / "offload"));  // the directory the run made goes too
    TrainConfig r = c;
    r.resume_dir = c.save_dir;
    EXPECT_EQ(train(r).last_step, 4);
    fs::remove_all(dir / "ckpt");
  }
}

}  // namespace
}  // namespace memfit
