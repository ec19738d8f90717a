// Training with --offload-params nvme (the blocks' working weights in a file, read per block
// before each use and written back by the update; Note [NVMe offload], "Working weights on
// disk") against the same run in RAM: the losses, the validation loss and the saved checkpoint
// are the same bytes in fp32, bf16 with master weights and pure bf16, with and without
// checkpointing, with an 8-bit optimizer, clipping and gradient accumulation; a resume from an
// offloaded checkpoint continues bit for bit; the planner's peak by category, files and I/O per
// step are the measured ones; the combinations it does not run are refused by name. (Stage 3
// over two ranks: tests/cli/zero_offload_test.cpp.)
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/core/error.h"
#include "memfit/plan/max_model.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/plan/search.h"
#include "trainer_fixture.h"
#include "../io/io_test_util.h"
#include "../support/scoped_env.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;


class ParamOffload : public test::TrainerFixture {
 protected:
  TrainConfig offloaded(TrainConfig c) const {
    c.offload_optimizer = "nvme";
    c.offload_params = "nvme";
    c.offload_dir = (dir / "offload").string();
    return c;
  }
  void expect_same_run(TrainConfig c, const std::string& what, bool blocks_on_disk = true) {
    SCOPED_TRACE(what);
    c.steps = 3;
    c.eval_every = 2;  // an evaluation between steps leaves prefetched reads behind
    c.eval_batches = 1;
    c.clip = 0.05f;  // acts on every step
    c.save_dir = (dir / "ram").string();
    fs::remove_all(c.save_dir);
    const TrainSummary ram = train(c);
    TrainConfig o = offloaded(c);
    o.save_dir = (dir / "off").string();
    fs::remove_all(o.save_dir);
    const TrainSummary off = train(o);
    ASSERT_EQ(ram.losses.size(), 3u);
    ASSERT_EQ(off.losses.size(), 3u);
    for (size_t i = 0; i < ram.losses.size(); ++i)
      EXPECT_EQ(ram.losses[i], off.losses[i]) << "step " << i + 1;
    EXPECT_EQ(ram.last_val_loss, off.last_val_loss);
    expect_same_checkpoint(dir / "ram", dir / "off");
    // The blocks left RAM: the working weights in the pool are the embeddings and the tail.
    const auto params = static_cast<size_t>(Category::params);
    if (blocks_on_disk)
      EXPECT_LT(off.peak_by_category[params], ram.peak_by_category[params]);
    else
      EXPECT_EQ(off.peak_by_category[params], ram.peak_by_category[params]);
    EXPECT_FALSE(fs::exists(dir / "offload"));  // scratch, removed, and the directory it made
  }
};

TEST_F(ParamOffload, Fp32BitIdenticalWithAndWithoutCheckpointing) {
  TrainConfig c = config();
  expect_same_run(c, "fp32 adamw");
  c.ckpt = "full";
  c.optim.name = "adamw8bit";
  expect_same_run(c, "fp32 adamw8bit, full checkpointing");
}

TEST_F(ParamOffload, Bf16BitIdenticalWithMasterWeightsAndPure) {
  TrainConfig c = config();
  c.precision = "bf16";
  c.optim.name = "adamw8bit";
  c.ckpt = "full";
  expect_same_run(c, "bf16 master adamw8bit, full checkpointing");
  c.optim.name = "adamw";
  c.ckpt = "none";
  c.master_weights = "none";
  expect_same_run(c, "pure bf16 adamw");
  c.optim.name = "adamw8bit";  // the 7B headline's configuration: no master weights on disk
  expect_same_run(c, "pure bf16 adamw8bit");
  TrainConfig l = config("llama-tiny");
  l.precision = "bf16";
  expect_same_run(l, "llama-tiny bf16 adamw");
  // fp8 stores bf16's working weights (Note [FP8]): they stream the same way.
  l.precision = "fp8";
  expect_same_run(l, "llama-tiny fp8 adamw");
}

TEST_F(ParamOffload, EveryPrefetchDepthAndTheThreadEngineBitIdentical) {
  TrainConfig c = config();
  c.precision = "bf16";
  for (int depth : {0, 2}) {
    c.prefetch_depth = depth;
    expect_same_run(c, fmt::format("--prefetch-depth {}", depth));
  }
  c.prefetch_depth = 1;
  const test::ScopedEnv env("MEMFIT_OFFLOAD_IO", "threads");
  expect_same_run(c, "threads");
}

TEST_F(ParamOffload, BlocksUnderThePersistThresholdStayInRam) {
  TrainConfig c = config();
  c.precision = "bf16";
  c.persist_threshold = int64_t{1} << 40;  // every block: the file is its header alone
  TrainConfig o = offloaded(c);
  o.steps = 2;
  const PlanReport plan = plan_training(resolve_run(o));
  EXPECT_EQ(plan.param_ring_bytes, 0u);
  EXPECT_EQ(plan.param_read_bytes, 0u);
  EXPECT_EQ(plan.by_category[static_cast<size_t>(Category::params)],
            MemoryPool::round_up(static_cast<size_t>(ParamLayout(plan.model).total()) * 2));
  const TrainSummary s = train(o);
  EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
  expect_same_run(c, "every block persistent", /*blocks_on_disk=*/false);
}


TEST_F(ParamOffload, ResumeFromOffloadedCheckpointIsBitIdentical) {
  for (const char* precision : {"fp32", "bf16"}) {
    SCOPED_TRACE(precision);
    TrainConfig c = config();
    c.precision = precision;
    c.optim.name = "adamw8bit";
    c.save_dir = (dir / "whole").string();
    fs::remove_all(c.save_dir);
    train(c);  // in RAM, straight through
    TrainConfig o = offloaded(c);
    o.save_dir = (dir / "split").string();
    fs::remove_all(o.save_dir);
    o.stop_after = 3;
    train(o);
    o.stop_after = 0;
    o.resume_dir = o.save_dir;
    train(o);  // offloaded again, from the offloaded checkpoint
    expect_same_checkpoint(dir / "whole", dir / "split");
  }
}

TEST_F(ParamOffload, PlannedPeakFilesAndIoEqualMeasured) {
  for (const char* precision : {"fp32", "bf16", "fp8"}) {
    SCOPED_TRACE(precision);
    TrainConfig c = offloaded(config());
    c.precision = precision;
    c.steps = 2;
    c.log_file = (dir / "log.jsonl").string();
    const PlanReport plan = plan_training(resolve_run(c));
    const TrainSummary s = train(c);
    EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
    for (Category cat : kAllCategories)
      EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                s.peak_by_category[static_cast<size_t>(cat)])
          << category_name(cat);
    // The params file: every block's aligned extent and a header page.
    EXPECT_GT(plan.disk_by_category[static_cast<size_t>(Category::params)], 0u);
    EXPECT_GT(plan.param_read_bytes, plan.param_written_bytes);  // two micro-batches
    int steps = 0;
    for (const auto& line : read_log(dir / "log.jsonl"))
      if (line.contains("offload") && line.contains("step")) {
        ++steps;
        EXPECT_EQ(line["offload"]["read_bytes"].get<uint64_t>() +
                      line["offload"]["written_bytes"].get<uint64_t>(),
                  plan.io_bytes_per_step);
        EXPECT_EQ(line["offload"]["params"]["read_bytes"].get<uint64_t>(),
                  plan.param_read_bytes);
        EXPECT_EQ(line["offload"]["params"]["written_bytes"].get<uint64_t>(),
                  plan.param_written_bytes);
      }
    EXPECT_EQ(steps, 2);
  }
}

TEST_F(ParamOffload, MaxModelFindsALargerModel) {
  TrainConfig c = config();
  c.precision = "bf16";
  c.optim.name = "adamw8bit";
  c.offload_optimizer = "nvme";
  c.offload_dir = (dir / "offload").string();
  c.ckpt = "auto";
  c.mem_limit = "256MiB";
  c.steps = 0;
  c.seq_len = 64;
  c.batch = 1;
  c.grad_accum = 1;
  RunSpec s = resolve_run(c);
  const size_t limit = size_t{256} << 20;
  const MaxModelResult state_only = find_max_model(s, limit);
  s.offload.params = true;
  const MaxModelResult with_params = find_max_model(s, limit);
  ASSERT_TRUE(state_only.found && with_params.found);
  EXPECT_GT(with_params.best.params, state_only.best.params);
}

TEST_F(ParamOffload, SearchOffloadsTheWeightsWhereOnlyThatFits) {
  TrainConfig c = config();
  c.n_layer = 8;  // enough blocks that the file saves more than the ring costs
  c.precision = "bf16";
  c.steps = 2;
  c.ckpt = "full";
  c.offload_dir = (dir / "offload").string();
  // The gradients stay in RAM (else their offload, which the search also tries, may fit this
  // budget too: OffloadGradsTrainer.SearchKeepsTheGradientsOnDiskWhereOnlyThatFits).
  c.offload_grads = "none";
  TrainConfig a = c;
  a.offload_optimizer = "nvme";
  const size_t state_only = plan_memory(resolve_run(a)).peak_bytes;
  a.offload_params = "nvme";
  const size_t with_params = plan_memory(resolve_run(a)).peak_bytes;
  ASSERT_LT(with_params, state_only);
  // --offload-dir alone: the search may offload; under this budget only the weights' offload
  // (with --ckpt full, the smallest policy) fits.
  const size_t limit = (with_params + state_only) / 2;
  c.ckpt = "auto";
  c.mem_limit = std::to_string(limit);
  const AutoResolution r = resolve_auto(c);
  EXPECT_TRUE(r.search.choice.offload && r.search.choice.offload_params);
  EXPECT_TRUE(r.spec().offload.params);
  EXPECT_NE(candidate_options(r.search.choice, false).find("--offload-params nvme"),
            std::string::npos);
  const TrainSummary s = train(c);
  EXPECT_LE(s.peak_bytes, limit);
  EXPECT_EQ(s.peak_bytes, plan_memory(r.spec()).peak_bytes);
  // A roomier budget keeps the weights in RAM (as fast, fewer files).
  c.mem_limit = std::to_string(state_only + (size_t{64} << 20));
  EXPECT_FALSE(resolve_auto(c).search.choice.offload_params);
}

TEST_F(ParamOffload, ZeroAutoOffloadsTheWorkingWeightsAtStageThreeWhereOnlyThatFits) {
  TrainConfig c = config();
  c.n_layer = 8;
  c.precision = "bf16";
  c.ckpt = "full";
  c.steps = 2;
  c.offload_dir = (dir / "offload").string();
  RunSpec s = resolve_run(c);
  s.world = 2;
  RunSpec a = s;
  a.zero = 3;
  a.offload.optimizer = true;
  const size_t state_only = plan_largest_rank(a).peak_bytes;
  a.offload.params = true;
  const size_t with_params = plan_largest_rank(a).peak_bytes;
  ASSERT_LT(with_params, state_only);
  // --zero auto with --offload-dir alone over two ranks: every stage in RAM and offloaded, and
  // stage 3 with the working weights offloaded too; under this budget only that fits.
  s.zero_auto = true;
  s.offload_open = true;
  const size_t limit = (with_params + state_only) / 2;
  const SearchResult r = search_training(s, limit, SearchSpace::of(s));
  ASSERT_TRUE(r.fits) << r.message;
  EXPECT_EQ(r.choice.zero, 3);
  EXPECT_TRUE(r.choice.offload && r.choice.offload_params);
  for (const Candidate& k : r.candidates)
    if (k.offload_params) { EXPECT_EQ(k.zero, 3) << "the weights offloaded below stage 3"; }
}

TEST_F(ParamOffload, ProfileShowsTheParamsFileAndTheWaitsOnIt) {
  TrainConfig c = offloaded(config());
  c.precision = "bf16";
  c.steps = 3;
  c.profile_steps = 2;
  c.profile_dir = (dir / "profile").string();
  const PlanReport plan = plan_training(resolve_run(c));
  train(c);
  std::ifstream in(dir / "profile" / "trace.json");
  const nlohmann::json trace = nlohmann::json::parse(in);
  std::map<std::string, std::set<size_t>> disk;  // track -> its values
  int param_waits = 0;
  for (const nlohmann::json& e : trace["traceEvents"]) {
    if (e["ph"] == "C" && e["name"].get<std::string>().starts_with("disk."))
      disk[e["name"]].insert(e["args"]["bytes"].get<size_t>());
    if (e["ph"] == "X" && e["name"] == "params io wait") {
      EXPECT_EQ(e["cat"], "io");
      ++param_waits;
    }
  }
  ASSERT_TRUE(disk.count("disk.params"));
  EXPECT_EQ(disk["disk.params"],
            std::set<size_t>{plan.disk_by_category[static_cast<size_t>(Category::params)]});
  // At least the reads waited for when their phase began (depth 1: block 0 at the embedding).
  EXPECT_GT(param_waits, 0);
}

TEST_F(ParamOffload, RefusesWhatItDoesNotRun) {
  auto message = [&](TrainConfig c) -> std::string {
    try {
      resolve_run(c);
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "accepted";
  };
  TrainConfig c = config();
  c.offload_params = "nvme";
  c.offload_dir = (dir / "offload").string();
  EXPECT_NE(message(c).find("--offload-params nvme needs --offload-optimizer nvme"),
            std::string::npos)
      << message(c);
  c.offload_params = "ssd";
  EXPECT_NE(message(c).find("--offload-params must be none or nvme, got 'ssd'"),
            std::string::npos)
      << message(c);
  // Over several ranks at stage 3 alone (each rank's shard in its file).
  RunSpec s = resolve_run(offloaded(config()));
  s.world = 2;
  s.zero = 3;
  s.check();
  s.zero = 2;
  try {
    s.check();
    FAIL() << "two ranks at stage 2 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--offload-params nvme under 2 ranks offloads each "
                                         "rank's shard of the working weights, so it needs "
                                         "--zero 3 (got --zero 2"),
              std::string::npos)
        << e.what();
  }
}

TEST_F(ParamOffload, IoErrorOnTheParamsFileNamesItAndKeepsLastCheckpoint) {
  TrainConfig c = offloaded(config());
  c.precision = "bf16";
  c.steps = 4;
  c.save_every = 1;
  c.save_dir = (dir / "ckpt").string();
  // gpt2-tiny: 4 units (embeddings, 2 blocks, tail), bf16 AdamW's 3 optimizer files. Requests:
  // the initial master weights (4) and blocks (2); a step's 6 block reads (3 a micro-batch: the
  // top block's forward and backward share one) and its update (24 optimizer-file requests, 2
  // block writes); the save's 12 reads. Request 52 is step 2's read of block 1, after step 1's
  // checkpoint.
  std::string m = "no error";
  {
    const test::ScopedEnv fail("MEMFIT_OFFLOAD_FAIL_IO", "52:EIO");
    try {
      train(c);
    } catch (const IoError& e) {
      m = e.what();
    }
  }
  EXPECT_NE(m.find(".params.offload failed"), std::string::npos) << m;
  EXPECT_NE(m.find("read of "), std::string::npos) << m;
  EXPECT_NE(m.find("errno 5"), std::string::npos) << m;
  // The last checkpoint is step 1's, whole; the scratch files are gone; the resume finishes
  // the run as the uninterrupted one does.
  const auto state =
      nlohmann::json::parse(io::testing::read_file(dir / "ckpt" / "trainer_state.json"));
  EXPECT_EQ(state["step"].get<int>(), 1);
  EXPECT_FALSE(fs::exists(dir / "offload"));  // the directory the run made goes too
  TrainConfig r = c;
  r.resume_dir = c.save_dir;
  EXPECT_EQ(train(r).last_step, 4);
  TrainConfig whole = config();
  whole.precision = "bf16";
  whole.steps = 4;
  whole.save_dir = (dir / "whole").string();
  train(whole);
  expect_same_checkpoint(dir / "whole", dir / "ckpt");
}

}  // namespace
}  // namespace memfit
