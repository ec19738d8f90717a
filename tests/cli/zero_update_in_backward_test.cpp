// --update-in-backward under `mpirun -n 2` at ZeRO stages 2 and 3 (Note [Update in backward]):
// each unit reduce-scattered and this rank's part stepped at once, against the ordinary run at
// the same stage: the logs (loss, gradient norm, validation) and the saved weights are the same
// bits, without clipping and with global clipping (two passes); each rank's planned peak by
// category is its measured one, with no gradient accumulator, and the planned collectives per
// step the measured ones, global clipping's second pass included; with the optimizer (and at
// stage 3 the working weights) offloaded, the run in RAM's bits and its plan per rank; stage 2
// with --precision fp8 stores the codes; stages 0-1 are refused.
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ZeroUpdateInBackward : public test::MpiBinaryTest {
 protected:
  ZeroUpdateInBackward() : MpiBinaryTest(2044) {}
  std::string args(const std::string& more) const {
    return fmt::format("--model gpt2-tiny --n-layer 2 --seq-len 32 --batch 2 --threads 1 "
                       "--steps 3 --eval-every 3 --eval-batches 1 --bucket-mb 0.25 --data '{}' {}",
                       (dir / "data").string(), more);
  }
  std::vector<json> lines(const fs::path& log) const {
    std::vector<json> out;
    std::istringstream in(test::slurp(log));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  std::string exported_weights(const fs::path& ck) const {
    const fs::path out = dir / ("hf-of-" + ck.filename().string());
    fs::remove_all(out);
    EXPECT_EQ(run_memfit(fmt::format("export --hf '{}' '{}'", out.string(), ck.string())), 0)
        << test::slurp(dir / "err.txt");
    return test::slurp(out / "model.safetensors");
  }
  // `memfit plan --json` of the fused run at `zero` with `more`, against the run's log: every
  // step's collectives (comm_bytes) are the plan's comm_per_step, and each rank's peak by
  // category its planned one, with no gradient accumulator. Returns the plan.
  json expect_plan_is_measured(int zero, const std::string& more) {
    SCOPED_TRACE(fmt::format("--zero {} {}", zero, more));
    const std::string a = args(fmt::format("{} --zero {} --update-in-backward", more, zero));
    EXPECT_EQ(run_memfit(fmt::format("plan {} --world-size 2 --json", a)), 0)
        << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    const fs::path log = dir / fmt::format("p{}.jsonl", zero);
    fs::remove(log);
    EXPECT_EQ(run_memfit("train " + a + fmt::format(" --log '{}'", log.string()), 2), 0)
        << test::slurp(dir / "err.txt");
    json measured;
    int steps = 0;
    for (const json& j : lines(log)) {
      if (j.contains("ranks")) measured = j["ranks"];
      if (j.contains("comm_bytes")) {
        ++steps;
        for (const char* c : {"all_reduce", "reduce_scatter", "all_gather"})
          EXPECT_EQ(j["comm_bytes"][c], plan["comm_per_step"][c]) << c;
      }
    }
    EXPECT_EQ(steps, 3) << "no comm_bytes in the log";
    EXPECT_EQ(measured.size(), 2u) << "no per-rank peaks in the log";
    for (int r = 0; r < 2 && r < static_cast<int>(measured.size()); ++r) {
      const json& p = plan["per_rank"][r];
      EXPECT_EQ(measured[r]["peak_bytes"], p["peak_bytes"]) << "rank " << r;
      for (const char* c : {"params", "master", "grads", "optimizer", "comm"})
        EXPECT_EQ(measured[r]["mem"].value(c, size_t{0}), p["by_category"].value(c, size_t{0}))
            << c << ", rank " << r;
      EXPECT_EQ(p["by_category"].value("grads", size_t{0}), 0u) << "an accumulator";
    }
    return plan;
  }
  // The ordinary run and the fused one at `zero` with `more`: the same log values and weights.
  void expect_same(int zero, const std::string& more) {
    SCOPED_TRACE(fmt::format("--zero {} {}", zero, more));
    std::vector<json> logs[2];
    std::string weights[2];
    for (int fused = 0; fused < 2; ++fused) {
      const fs::path log = dir / fmt::format("l{}.jsonl", fused), ck = dir / fmt::format("c{}", fused);
      fs::remove_all(ck);
      const std::string a =
          args(more) + fmt::format(" --zero {} --log '{}' --save '{}'{}", zero, log.string(),
                                   ck.string(), fused ? " --update-in-backward" : "");
      ASSERT_EQ(run_memfit("train " + a, 2), 0) << test::slurp(dir / "err.txt");
      logs[fused] = lines(log);
      weights[fused] = exported_weights(ck);
    }
    ASSERT_EQ(logs[0].size(), logs[1].size());
    int compared = 0;
    for (size_t i = 0; i < logs[0].size(); ++i)
      for (const char* key : {"loss", "grad_norm", "val_loss"})
        if (logs[0][i].contains(key)) {
          EXPECT_EQ(logs[0][i][key], logs[1][i][key]) << key << " at line " << i;
          ++compared;
        }
    EXPECT_GE(compared, 7);
    EXPECT_FALSE(weights[0].empty());
    EXPECT_TRUE(weights[0] == weights[1]) << "the saved weights differ";
  }
};

TEST_F(ZeroUpdateInBackward, StagesTwoAndThreeAreTheOrdinaryStepBitForBit) {
  for (int zero : {2, 3}) {
    expect_same(zero, "--clip 0 --precision bf16 --optim adamw8bit");
    expect_same(zero, "--clip 0.05 --optim adamw");  // global clipping: two passes
  }
}

TEST_F(ZeroUpdateInBackward, ThePlanPerRankIsEachRanksMeasuredPeak) {
  for (int zero : {2, 3}) expect_plan_is_measured(zero, "--clip 0 --precision bf16");
}

// Global clipping runs the micro-batch twice (Note [Update in backward], "Clipping"), and each
// pass reduce-scatters every unit (and at stage 3 gathers the blocks): the plan's collectives
// per step are the run's, the reduce-scatters twice one pass's, the gathers one pass's blocks
// more; the plan says that the backward runs twice.
TEST_F(ZeroUpdateInBackward, GlobalClippingsSecondPassIsInThePlannedCollectives) {
  for (int zero : {2, 3}) {
    SCOPED_TRACE(fmt::format("stage {}", zero));
    const std::string opts = fmt::format("--zero {} --update-in-backward --world-size 2", zero);
    ASSERT_EQ(run_memfit(fmt::format("plan {} {} --clip 0 --json", args(""), opts)), 0)
        << test::slurp(dir / "err.txt");
    const json one = json::parse(test::slurp(dir / "out.txt"))["comm_per_step"];
    ASSERT_EQ(run_memfit(fmt::format("plan {} {} --clip 0.05", args(""), opts)), 0)
        << test::slurp(dir / "err.txt");
    EXPECT_NE(test::slurp(dir / "out.txt").find("runs the backward twice"), std::string::npos)
        << test::slurp(dir / "out.txt");
    const json plan = expect_plan_is_measured(zero, "--clip 0.05");
    EXPECT_EQ(plan["backward_passes"], 2);
    const json two = plan["comm_per_step"];
    EXPECT_GT(one["reduce_scatter"].get<int64_t>(), 0);
    EXPECT_EQ(two["reduce_scatter"].get<int64_t>(), 2 * one["reduce_scatter"].get<int64_t>());
    EXPECT_EQ(two["all_reduce"], 0);
    if (zero == 2)  // the updated weights, once
      EXPECT_EQ(two["all_gather"], one["all_gather"]);
    else  // the persistent units once, the blocks each pass
      EXPECT_GT(two["all_gather"].get<int64_t>(), one["all_gather"].get<int64_t>());
  }
}

// --precision fp8 at stage 2 stores the linears as E4M3 codes (Note [FP8], "Storage"): the
// fused backward steps this rank's master shard, and the codes are encoded with the agreed
// scales and gathered after it, as after the ordinary update: the same bits as the ordinary
// run, with global clipping too, and each rank's plan (the codes, their gather) its measured.
TEST_F(ZeroUpdateInBackward, Fp8StoredWeightsAtStageTwoAreTheOrdinaryStepBitForBit) {
  expect_same(2, "--clip 0 --precision fp8");
  expect_same(2, "--clip 0.05 --precision fp8");
  expect_plan_is_measured(2, "--clip 0 --precision fp8");
}

// --update-in-backward with the optimizer offloaded over ranks (Note [Update in backward],
// "With offload"): each rank streams its shard's state (and master weights) through its ring
// as the units' parts are reduce-scattered, at stage 3 also with --offload-params (the rank's
// part of each block stepped in the slot its backward read, written back to its file). Against
// the ordinary run in RAM at the same stage: the same logs and checkpoint files bit for bit,
// without clipping and with global clipping (two passes); each rank's plan its measured peak
// by category, files and I/O per step, and its collectives.
TEST_F(ZeroUpdateInBackward, OffloadedOverRanksEqualsTheRunInRamAndItsPlan) {
  const std::string off =
      fmt::format("--offload-optimizer nvme --offload-dir '{}'", (dir / "off").string());
  struct Case {
    int zero;
    std::string more, offload;
  };
  const std::vector<Case> cases = {
      {2, "--clip 0 --precision bf16 --optim adamw8bit", off},
      {2, "--clip 0.05 --optim adamw", off},
      {3, "--clip 0 --precision bf16 --optim adamw8bit", off},
      {3, "--clip 0.05 --precision bf16", off + " --offload-params nvme"},
      {3, "--clip 0 --precision bf16 --master-weights none", off + " --offload-params nvme"}};
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(fmt::format("--zero {} {} {}", c.zero, c.more, c.offload));
    const fs::path ram = dir / fmt::format("ram{}", n), fused = dir / fmt::format("fused{}", n);
    ++n;
    const std::string common = args(fmt::format("{} --zero {}", c.more, c.zero));
    ASSERT_EQ(run_memfit(fmt::format("train {} --save '{}' --log '{}.jsonl'", common,
                                     ram.string(), ram.string()),
                         2),
              0)
        << test::slurp(dir / "err.txt");
    const std::string a = fmt::format("{} --update-in-backward {}", common, c.offload);
    ASSERT_EQ(run_memfit(fmt::format("train {} --save '{}' --log '{}.jsonl'", a, fused.string(),
                                     fused.string()),
                         2),
              0)
        << test::slurp(dir / "err.txt");
    std::vector<json> logs[2] = {lines(ram.string() + ".jsonl"), lines(fused.string() + ".jsonl")};
    ASSERT_EQ(logs[0].size(), logs[1].size());
    int compared = 0;
    json measured;
    for (size_t i = 0; i < logs[0].size(); ++i) {
      for (const char* key : {"loss", "grad_norm", "val_loss"})
        if (logs[0][i].contains(key)) {
          EXPECT_EQ(logs[0][i][key], logs[1][i][key]) << key << " at line " << i;
          ++compared;
        }
      if (logs[1][i].contains("ranks")) measured = logs[1][i]["ranks"];
    }
    EXPECT_GE(compared, 7);
    EXPECT_TRUE(exported_weights(ram) == exported_weights(fused)) << "the saved weights differ";
    for (const auto& e : fs::directory_iterator(ram)) {
      if (e.path().extension() != ".safetensors") continue;  // the shards and optimizer state
      EXPECT_TRUE(test::slurp(e.path()) == test::slurp(fused / e.path().filename()))
          << e.path().filename() << " differs";
    }
    ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size 2 --json", a)), 0)
        << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    ASSERT_EQ(measured.size(), 2u) << "no per-rank peaks in the log";
    for (int r = 0; r < 2; ++r) {
      const json& p = plan["per_rank"][r];
      const json& m = measured[r];
      EXPECT_EQ(m["peak_bytes"], p["peak_bytes"]) << "rank " << r;
      EXPECT_EQ(m["mem"], p["by_category"]) << "rank " << r;
      EXPECT_EQ(p["by_category"].value("grads", size_t{0}), 0u) << "an accumulator";
      EXPECT_EQ(m["offload"]["disk"], p["offload"]["disk_by_category"]) << "rank " << r;
      EXPECT_EQ(m["offload"]["io_bytes_per_step"], p["offload"]["io_bytes_per_step"])
          << "rank " << r;
      EXPECT_FALSE(fs::exists(dir / "off" / fmt::format("rank-{}", r)));
    }
    for (const json& j : logs[1]) {
      if (j.contains("comm_bytes")) {
        for (const char* k : {"all_reduce", "reduce_scatter", "all_gather"})
          EXPECT_EQ(j["comm_bytes"][k], plan["comm_per_step"][k]) << k;
      }
    }
  }
}

TEST_F(ZeroUpdateInBackward, StagesZeroAndOneAreRefused) {
  for (int zero : {0, 1}) {
    EXPECT_EQ(run_memfit("train " + args(fmt::format("--clip 0 --zero {} --update-in-backward", zero)), 2), 2);
    EXPECT_NE(test::slurp(dir / "err.txt").find("needs --zero 2 or 3"), std::string::npos)
        << test::slurp(dir / "err.txt");
  }
}

}  // namespace
}  // namespace memfit
