// ZeRO with the optimizer offloaded, through the built binary under `mpirun -n 2`: each rank
// offloads its own shard (rank-<r>/ under one shared --offload-dir), and stages 1, 2 and 3 train
// to the same losses, gradient norms and saved checkpoint files, bit for bit, as the same run in
// RAM (fp32 with clipping and accumulation; bf16 with master weights and 8-bit AdamW; pure
// bf16); `memfit plan --world-size 2` is every rank's measured peak by category, files and I/O;
// a sharded save of an offloaded run resumes bit-identically offloaded and in RAM, and a RAM
// run's into offload (stage 2; stage 3 in fp32 and in bf16 with master weights); --zero auto
// with --offload-dir chooses offload where nothing fits in RAM and trains at it; stage 0 is
// refused with the reason. Note [NVMe offload], "Under ZeRO" (docs/notes/offload.md).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <map>
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

class ZeroOffload : public test::MpiBinaryTest {
 protected:
  ZeroOffload() : MpiBinaryTest(1515) {}
  std::string args(const std::string& more) const {
    return fmt::format("--model gpt2-tiny --n-layer 2 --seq-len 32 --batch 2 --threads 1 "
                       "--data '{}' {}",
                       (dir / "data").string(), more);
  }
  std::string offload() const {
    return fmt::format("--offload-optimizer nvme --offload-dir '{}'", (dir / "off").string());
  }
  std::vector<json> lines(const fs::path& log) const {
    std::vector<json> out;
    std::istringstream in(test::slurp(log));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  void train(const std::string& more) {
    ASSERT_EQ(run_memfit("train " + args(more), 2), 0) << more << ": " << test::slurp(dir / "err.txt");
  }
  // Every file of a checkpoint directory, by name.
  static std::map<std::string, std::string> files_of(const fs::path& ck) {
    std::map<std::string, std::string> out;
    for (const auto& e : fs::directory_iterator(ck))
      out[e.path().filename()] = test::slurp(e.path());
    return out;
  }
  // The two logs' training and validation lines agree on every value that is not a time or a
  // memory figure; the two checkpoints hold the same files, byte for byte.
  void expect_same_run(const fs::path& log_a, const fs::path& log_b, const fs::path& ck_a,
                       const fs::path& ck_b, const std::string& what) {
    std::vector<json> a, b;
    for (const json& j : lines(log_a))
      if (j.contains("loss") || j.contains("val_loss")) a.push_back(j);
    for (const json& j : lines(log_b))
      if (j.contains("loss") || j.contains("val_loss")) b.push_back(j);
    ASSERT_EQ(a.size(), b.size()) << what;
    ASSERT_GE(a.size(), 3u) << what;
    for (size_t i = 0; i < a.size(); ++i)
      for (const char* key : {"step", "loss", "grad_norm", "val_loss", "comm_bytes"})
        EXPECT_EQ(a[i].value(key, json()), b[i].value(key, json())) << what << ": " << key << " " << i;
    const auto want = files_of(ck_a), got = files_of(ck_b);
    EXPECT_EQ(want.size(), got.size()) << what;
    EXPECT_TRUE(want.count("zero_shards.json")) << what << ": not a sharded save";
    for (const auto& [name, bytes] : want) {
      ASSERT_TRUE(got.count(name)) << what << ": " << name;
      EXPECT_TRUE(got.at(name) == bytes) << what << ": " << name << " differs";
    }
  }
  // At stages 1, 2 and 3: the run in RAM and offloaded give the same logs and checkpoint files
  // (and the RAM runs of every stage are stage 0's: Zero.* in tests/cli/zero_test.cpp); the
  // offload files are gone afterwards, each rank's directory left empty.
  void offloaded_equals_ram(const std::string& more) {
    for (int zero = 1; zero <= 3; ++zero) {
      const std::string common = fmt::format("{} --zero {}", more, zero);
      const fs::path ram = dir / fmt::format("ram{}", zero), off = dir / fmt::format("off{}", zero);
      train(fmt::format("{} --save '{}' --log '{}.jsonl'", common, ram.string(), ram.string()));
      train(fmt::format("{} {} --save '{}' --log '{}.jsonl'", common, offload(), off.string(),
                        off.string()));
      bool offloaded = false;
      for (const json& j : lines(off.string() + ".jsonl"))
        if (j.contains("offload")) offloaded = j["offload"]["read_bytes"].get<uint64_t>() > 0;
      EXPECT_TRUE(offloaded) << "stage " << zero << ": no offload I/O logged";
      expect_same_run(ram.string() + ".jsonl", off.string() + ".jsonl", ram, off,
                      fmt::format("stage {}", zero));
      for (int r = 0; r < 2; ++r) {
        // The run made rank-<r>/ and removes it with its files when it ends.
        const fs::path d = dir / "off" / fmt::format("rank-{}", r);
        EXPECT_FALSE(fs::exists(d)) << d << ": scratch files or their directory left behind";
      }
    }
  }
};

// FP32 (the weights of record are the working weights, in RAM: at stage 3 the rank's shard of
// them; the moments offloaded), clipping active at every step and two micro-batches a step.
TEST_F(ZeroOffload, StagesOneToThreeEqualRamInFp32) {
  offloaded_equals_ram("--steps 3 --grad-accum 2 --clip 0.05 --eval-batches 1");
}

// bf16 with FP32 master weights (offloaded: read back and gathered for the save; at stage 3 the
// update rounds the rank's working shard and the persistent units are gathered again) and 8-bit
// AdamW, whose shards and pieces cut at its 256-element blocks.
TEST_F(ZeroOffload, StagesOneToThreeEqualRamInBf16WithMasterWeightsAnd8BitAdamW) {
  offloaded_equals_ram("--steps 3 --precision bf16 --optim adamw8bit --clip 0.05 --eval-batches 1");
}

// Pure bf16 (--master-weights none: the weights of record are the bf16 working weights, at stage
// 3 the rank's shard, saved as BF16; AdamW's moments offloaded, stochastic rounding in the update).
TEST_F(ZeroOffload, StagesOneToThreeEqualRamInPureBf16) {
  offloaded_equals_ram("--steps 3 --precision bf16 --master-weights none --eval-batches 1");
}

// --offload-params nvme at stage 3 (Note [NVMe offload], "Working weights on disk"): each
// rank's shard of the working weights in its file (rank-<r>/), each block's part read, then
// all-gathered; the update writes each rank's part back. The logs and every checkpoint file are
// the in-RAM stage 3's bit for bit (fp32 with clipping and accumulation, bf16 with master weights
// and 8-bit AdamW, pure bf16), and every rank's planned peak by category, files and I/O per step
// are its measured ones; without --zero 3 it is refused with the reason.
TEST_F(ZeroOffload, StageThreeWithTheWorkingWeightsOffloadedEqualsRamAndItsPlan) {
  const std::string params = offload() + " --offload-params nvme";
  int run = 0;
  for (const char* more : {"--steps 3 --grad-accum 2 --clip 0.05 --eval-batches 1",
                           "--steps 3 --precision bf16 --optim adamw8bit --clip 0.05 "
                           "--eval-batches 1",
                           "--steps 3 --precision bf16 --master-weights none --eval-batches 1"}) {
    const std::string common = fmt::format("{} --zero 3", more);
    const fs::path ram = dir / fmt::format("pram{}", run), off = dir / fmt::format("poff{}", run);
    ++run;
    train(fmt::format("{} --save '{}' --log '{}.jsonl'", common, ram.string(), ram.string()));
    train(fmt::format("{} {} --save '{}' --log '{}.jsonl'", common, params, off.string(),
                      off.string()));
    json measured;
    bool read = false;
    for (const json& j : lines(off.string() + ".jsonl")) {
      if (j.contains("offload")) read = j["offload"]["params"]["read_bytes"].get<uint64_t>() > 0;
      if (j.contains("ranks")) measured = j["ranks"];
    }
    EXPECT_TRUE(read) << more << ": no reads of the params file logged";
    expect_same_run(ram.string() + ".jsonl", off.string() + ".jsonl", ram, off, more);
    ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size 2 --json", args(common + " " + params))),
              0)
        << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    ASSERT_EQ(measured.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      const json& p = plan["per_rank"][r];
      const json& m = measured[r];
      EXPECT_EQ(m["peak_bytes"], p["peak_bytes"]) << more << " rank " << r;
      EXPECT_EQ(m["mem"], p["by_category"]) << more << " rank " << r;
      EXPECT_FALSE(p["by_category"].contains("params")) << "the shard is on disk";
      EXPECT_GT(p["offload"]["disk_by_category"].value("params", 0), 0);
      EXPECT_EQ(m["offload"]["disk"], p["offload"]["disk_by_category"]) << more << " rank " << r;
      EXPECT_EQ(m["offload"]["io_bytes_per_step"], p["offload"]["io_bytes_per_step"]) << r;
      EXPECT_FALSE(fs::exists(dir / "off" / fmt::format("rank-{}", r)));
    }
  }
  // A save stopped halfway resumes, offloaded again, to the uninterrupted RAM run's files
  // (the bf16 run above: master weights read back, 8-bit state streamed in).
  const std::string bf16 =
      "--steps 3 --precision bf16 --optim adamw8bit --clip 0.05 --eval-batches 1 --zero 3";
  const fs::path split = dir / "psplit";
  train(fmt::format("{} {} --save '{}' --stop-after 2", bf16, params, split.string()));
  train(fmt::format("{} {} --save '{}' --resume '{}'", bf16, params, split.string(),
                    split.string()));
  const auto want = files_of(dir / "pram1"), got = files_of(split);
  for (const auto& [name, bytes] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(got.at(name) == bytes) << name << " differs after the resume";
  }
  EXPECT_NE(run_memfit("train " + args("--steps 1 --zero 2 " + params), 2), 0);
  EXPECT_NE(test::slurp(dir / "err.txt").find("--offload-params nvme under 2 ranks"),
            std::string::npos)
      << test::slurp(dir / "err.txt");
}

// The plan per rank is each rank's measured peak by category (the ring in staging, no master or
// optimizer bytes in RAM; at stage 3 the working shard in params and the gathered units in comm
// beside the ring), its files by category and its bytes read and written per step.
TEST_F(ZeroOffload, ThePlanPerRankIsEachRanksMeasuredPeakAndFiles) {
  uint64_t params[4][2] = {}, comm[4][2] = {};  // by stage and rank, planned (== measured)
  for (int zero = 1; zero <= 3; ++zero) {
    const std::string a = args(fmt::format("--steps 2 --bucket-mb 0.25 --precision bf16 --optim "
                                           "adamw8bit --zero {} {}",
                                           zero, offload()));
    ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size 2 --json", a)), 0)
        << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    ASSERT_EQ(plan["per_rank"].size(), 2u);
    const fs::path log = dir / fmt::format("p{}.jsonl", zero);
    ASSERT_EQ(run_memfit("train " + a + fmt::format(" --log '{}'", log.string()), 2), 0)
        << test::slurp(dir / "err.txt");
    json measured;
    for (const json& j : lines(log))
      if (j.contains("ranks")) measured = j["ranks"];
    ASSERT_EQ(measured.size(), 2u) << "no per-rank peaks in the log";
    for (int r = 0; r < 2; ++r) {
      const json& p = plan["per_rank"][r];
      const json& m = measured[r];
      EXPECT_EQ(m["peak_bytes"], p["peak_bytes"]) << "stage " << zero << " rank " << r;
      EXPECT_EQ(m["mem"], p["by_category"]) << "stage " << zero << " rank " << r;
      EXPECT_FALSE(p["by_category"].contains("optimizer"));
      EXPECT_FALSE(p["by_category"].contains("master"));
      ASSERT_TRUE(p.contains("offload"));
      EXPECT_EQ(m["offload"]["disk"], p["offload"]["disk_by_category"]) << "rank " << r;
      EXPECT_EQ(m["offload"]["io_bytes_per_step"], p["offload"]["io_bytes_per_step"]) << r;
      EXPECT_GT(p["offload"]["disk_by_category"].value("master", 0), 0);
      params[zero][r] = p["by_category"]["params"];
      comm[zero][r] = p["by_category"]["comm"];
    }
    // Each rank's files are its shard's: each under the one-process run's, together at least
    // theirs (two headers, and the unit cut between the ranks is one piece more to align).
    ASSERT_EQ(run_memfit(fmt::format("plan {} --zero 0 --json", args(fmt::format(
                                                                 "--steps 2 --precision bf16 "
                                                                 "--optim adamw8bit {}",
                                                                 offload())))),
              0)
        << test::slurp(dir / "err.txt");
    const uint64_t whole = json::parse(test::slurp(dir / "out.txt"))["offload"]["disk_bytes"];
    const uint64_t d0 = plan["per_rank"][0]["offload"]["disk_bytes"],
                   d1 = plan["per_rank"][1]["offload"]["disk_bytes"];
    EXPECT_LT(d0, whole);
    EXPECT_LT(d1, whole);
    EXPECT_GE(d0 + d1, whole);
  }
  // Stage 3 holds its shard of the working weights, and the gathered units beside the ring.
  for (int r = 0; r < 2; ++r) {
    EXPECT_LT(params[3][r], params[2][r]) << r;
    EXPECT_GT(comm[3][r], comm[2][r]) << r;
  }
}

// A sharded save of an offloaded run (stage 2, bf16 master weights, 8-bit AdamW) stopped after 2
// of 4 steps: resumed offloaded, and resumed in RAM, it ends with the uninterrupted offloaded
// run's losses and checkpoint files bit for bit; so does a RAM run's save resumed offloaded; one
// process loads it offloaded as in RAM.
TEST_F(ZeroOffload, ShardedCheckpointsResumeBitIdenticallyIntoAndOutOfOffload) {
  const std::string common =
      "--steps 4 --precision bf16 --optim adamw8bit --zero 2 --clip 0.05 --eval-batches 1";
  auto path = [&](const char* name) { return (dir / name).string(); };
  train(fmt::format("{} {} --save '{}' --log '{}.jsonl'", common, offload(), path("full"),
                    path("full")));
  train(fmt::format("{} {} --stop-after 2 --save '{}'", common, offload(), path("part-off")));
  train(fmt::format("{} --stop-after 2 --save '{}'", common, path("part-ram")));
  EXPECT_TRUE(fs::exists(dir / "part-off" / "zero-rank-00001-of-00002.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "part-off" / "optimizer.safetensors"));
  // The halfway saves are the same files whether the state was offloaded or not.
  const auto off_files = files_of(dir / "part-off"), ram_files = files_of(dir / "part-ram");
  EXPECT_TRUE(off_files == ram_files) << "the halfway saves differ";
  struct Resume {
    const char* from;
    bool offloaded;
    const char* into;
  };
  for (const Resume& r : {Resume{"part-off", true, "res-off-off"},
                          Resume{"part-off", false, "res-off-ram"},
                          Resume{"part-ram", true, "res-ram-off"}}) {
    const fs::path log = dir / (std::string(r.into) + ".jsonl");
    // The halfway log's lines, then the resumed run's: the whole run's log.
    fs::copy_file(path("full") + ".jsonl", log);
    train(fmt::format("{} {} --resume '{}' --save '{}' --log '{}'", common,
                      r.offloaded ? offload() : "", path(r.from), path(r.into), log.string()));
    expect_same_run(path("full") + ".jsonl", log, dir / "full", dir / r.into, r.into);
  }
  // One process loads the offloaded run's shards into its files (the whole range, from every
  // shard) as it does into RAM: resumed with no step left to run, both save the same
  // optimizer.safetensors and weights.
  for (const char* into : {"one-ram", "one-off"}) {
    const bool off = std::string(into) == "one-off";
    ASSERT_EQ(run_memfit("train " + args(fmt::format("{} {} --stop-after 2 --resume '{}' --save '{}'",
                                                     common, off ? offload() : "",
                                                     path("part-off"), path(into)))),
              0)
        << into << ": " << test::slurp(dir / "err.txt");
  }
  for (const char* file : {"optimizer.safetensors", "model.safetensors"}) {
    const std::string a = test::slurp(dir / "one-ram" / file);
    EXPECT_FALSE(a.empty()) << file;
    EXPECT_TRUE(a == test::slurp(dir / "one-off" / file)) << file << " differs";
  }
}

// Stage 3 offloaded, stopped after 2 of 4 steps: resumed offloaded, it ends with the uninterrupted
// offloaded run's losses and checkpoint files bit for bit, in fp32 (the weights of record are the
// working shard, loaded from the checkpoint and gathered for the save) and in bf16 with master
// weights (offloaded, loaded into the master files and rounded into the shard); the bf16 save
// also resumes in RAM at stage 3, and its halfway files are the RAM run's.
TEST_F(ZeroOffload, StageThreeOffloadedResumesBitIdentically) {
  auto path = [&](const std::string& name) { return (dir / name).string(); };
  for (const char* precision : {"fp32", "bf16"}) {
    const bool bf16 = std::string(precision) == "bf16";
    const std::string common = fmt::format(
        "--steps 4 --zero 3 --precision {} --clip 0.05 --eval-batches 1{}", precision,
        bf16 ? " --optim adamw8bit" : " --grad-accum 2");
    const std::string p = precision;
    train(fmt::format("{} {} --save '{}' --log '{}.jsonl'", common, offload(), path(p + "-full"),
                      path(p + "-full")));
    train(fmt::format("{} {} --stop-after 2 --save '{}'", common, offload(), path(p + "-part")));
    EXPECT_TRUE(fs::exists(dir / (p + "-part") / "zero-rank-00001-of-00002.safetensors"));
    std::vector<std::pair<std::string, bool>> resumes = {{p + "-res-off", true}};
    if (bf16) {
      train(fmt::format("{} --stop-after 2 --save '{}'", common, path(p + "-part-ram")));
      EXPECT_TRUE(files_of(dir / (p + "-part")) == files_of(dir / (p + "-part-ram")))
          << p << ": the halfway saves differ";
      resumes.push_back({p + "-res-ram", false});
    }
    for (const auto& [into, offloaded] : resumes) {
      const fs::path log = dir / (into + ".jsonl");
      fs::copy_file(path(p + "-full") + ".jsonl", log);
      train(fmt::format("{} {} --resume '{}' --save '{}' --log '{}'", common,
                        offloaded ? offload() : "", path(p + "-part"), path(into), log.string()));
      expect_same_run(path(p + "-full") + ".jsonl", log, dir / (p + "-full"), dir / into, into);
    }
  }
}

// Offload under several ranks needs a sharded state: stage 0 (every rank would write the whole
// state) is refused before anything is built, naming --zero 1, 2 or 3; --disk-limit is per rank.
TEST_F(ZeroOffload, StageZeroIsRefusedAndTheDiskLimitIsPerRank) {
  EXPECT_EQ(run_memfit(fmt::format("plan {} --world-size 2", args("--zero 0 " + offload()))), 2);
  EXPECT_NE(test::slurp(dir / "err.txt").find("so it needs --zero 1, 2 or 3"), std::string::npos)
      << test::slurp(dir / "err.txt");
  EXPECT_NE(run_memfit("train " + args("--steps 1 --zero 0 " + offload()), 2), 0);
  EXPECT_NE(test::slurp(dir / "err.txt").find("so it needs --zero 1, 2 or 3 (got --zero 0: every "
                                              "rank would write the whole state)"),
            std::string::npos)
      << test::slurp(dir / "err.txt");
  EXPECT_NE(run_memfit("train " + args("--steps 1 --zero 1 --disk-limit 64KiB " + offload()), 2), 0);
  EXPECT_NE(test::slurp(dir / "err.txt").find("(the limit is per rank)"), std::string::npos)
      << test::slurp(dir / "err.txt");
}

// --zero auto with --offload-dir over two ranks: under a per-rank budget below every stage's
// peak in RAM, the search takes an offloaded candidate at a stage that shards the state (16
// blocks, so each rank's shard of the state outweighs the ring), and the ranks train at it:
// offloaded, at that stage, every rank's peak within the budget.
TEST_F(ZeroOffload, ZeroAutoChoosesOffloadWhereNoStageFitsInRamAndTrainsAtIt) {
  const std::string base = fmt::format(
      "--model gpt2-tiny --n-layer 16 --seq-len 32 --batch 2 --threads 1 --data '{}' --steps 2 "
      "--precision bf16 --ckpt none",
      (dir / "data").string());
  size_t least = SIZE_MAX;  // the least largest-rank peak in RAM of any stage
  for (int zero = 0; zero <= 3; ++zero) {
    ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size 2 --zero {} --json", base, zero)), 0)
        << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    size_t most = 0;
    for (const json& r : plan.at("per_rank")) most = std::max(most, r["peak_bytes"].get<size_t>());
    ASSERT_GT(most, 0u) << "--zero " << zero << ": no per-rank peaks";
    least = std::min(least, most);
  }
  const size_t limit = least - 1;
  const std::string dir_opt = fmt::format("--offload-dir '{}'", (dir / "off").string());
  ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size 2 --zero auto --mem-limit {} {} --json",
                                   base, limit, dir_opt)),
            0)
      << test::slurp(dir / "err.txt");
  const json plan = json::parse(test::slurp(dir / "out.txt"));
  ASSERT_TRUE(plan["search"]["fits"].get<bool>()) << plan["search"].dump();
  const int stage = plan["search"]["choice"]["zero"];
  EXPECT_GE(stage, 1);
  EXPECT_TRUE(plan["search"]["choice"]["offload"].get<bool>()) << plan["search"].dump();
  const fs::path log = dir / "auto.jsonl";
  ASSERT_EQ(run_memfit(fmt::format("train {} --zero auto --mem-limit {} {} --log '{}'", base, limit,
                                   dir_opt, log.string()),
                       2),
            0)
      << test::slurp(dir / "err.txt");
  int offloaded_steps = 0, summaries = 0;
  for (const json& j : lines(log)) {
    if (j.contains("loss") && j.contains("offload")) ++offloaded_steps;
    if (!j.contains("ranks")) continue;
    ++summaries;
    EXPECT_EQ(j["zero"], stage) << j.dump();
    for (const json& r : j["ranks"]) {
      EXPECT_LE(r["peak_bytes"].get<size_t>(), limit) << r.dump();
      EXPECT_TRUE(r.contains("offload")) << r.dump();
    }
  }
  EXPECT_EQ(offloaded_steps, 2);
  EXPECT_EQ(summaries, 1);
}

// The ranks agree on whether the state is offloaded, not on where: each rank's --offload-dir is
// its own (here two directories, each rank's files in its rank-<r>/), and a rank that does not
// offload while the other does is refused before the first step, naming the option.
TEST_F(ZeroOffload, RanksAgreeOnOffloadButNotOnItsDirectory) {
  // One rank per command line (OpenMPI's MPMD form), output in dir/out.txt and dir/err.txt.
  auto mpmd = [&](const std::string& rank0, const std::string& rank1) {
    const std::string binary = fmt::format("{}/memfit train ", MEMFIT_BINARY_DIR);
    const std::string command = fmt::format(
        "ASAN_OPTIONS=detect_leaks=0 {} --allow-run-as-root --oversubscribe -n 1 {}{} : -n 1 "
        "{}{} > '{}' 2> '{}'",
        MEMFIT_MPIEXEC, binary, args(rank0), binary, args(rank1), (dir / "out.txt").string(),
        (dir / "err.txt").string());
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  };
  const std::string common = "--steps 2 --zero 1 --offload-optimizer nvme";
  ASSERT_EQ(mpmd(fmt::format("{} --offload-dir '{}'", common, (dir / "a").string()),
                 fmt::format("{} --offload-dir '{}'", common, (dir / "b").string())),
            0)
      << test::slurp(dir / "err.txt");
  // Each rank made its own directory and rank-<r>/ in it, and removed both at the end
  // (io/created_directories.h).
  for (const char* d : {"a", "b"}) EXPECT_FALSE(fs::exists(dir / d)) << d;
  EXPECT_NE(mpmd(fmt::format("{} --offload-dir '{}'", common, (dir / "a").string()),
                 "--steps 2 --zero 1"),
            0);
  EXPECT_NE(test::slurp(dir / "err.txt")
                .find("ranks disagree about --offload-optimizer: rank 0 has nvme, rank 1 has none"),
            std::string::npos)
      << test::slurp(dir / "err.txt");
}

}  // namespace
}  // namespace memfit
