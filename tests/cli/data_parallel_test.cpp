// Data parallelism end to end, through the built binary under `mpirun -n 2`: two ranks with
// micro-batch B train as one process with batch 2 B (losses within 1e-5 relative over 20 steps,
// the same validation), rank 0 alone logs, and `memfit plan --ranks 2` is each rank's measured
// peak. Skips where memfit was built without MPI.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class DataParallel : public test::MpiBinaryTest {
 protected:
  DataParallel() : MpiBinaryTest(4242) {}
  // Runs `memfit args`, alone (ranks 0) or under mpirun; returns the exit code.
  int run(int ranks, const std::string& args) const {
    return run_memfit(args, ranks);
  }
  std::string args(int batch, int steps = 20) const {
    return fmt::format("--model gpt2-tiny --n-layer 2 --seq-len 32 --batch {} --steps {} "
                       "--eval-every 10 --eval-batches 2 --threads 1 --data '{}'",
                       batch, steps, (dir / "data").string());
  }
  std::vector<json> lines(const fs::path& log) const {
    std::vector<json> out;
    std::istringstream in(test::slurp(log));
    // The step lines (the run's last line, every rank's peak, has no step).
    for (std::string line; std::getline(in, line);)
      if (json j = json::parse(line); j.contains("step")) out.push_back(j);
    return out;
  }
};

TEST_F(DataParallel, TwoRanksTrainAsOneProcessWithTwiceTheBatch) {
  ASSERT_EQ(run(0, "train " + args(4) + fmt::format(" --log '{}'", (dir / "one.jsonl").string())), 0)
      << test::slurp(dir / "err.txt");
  ASSERT_EQ(run(2, "train " + args(2) + fmt::format(" --log '{}'", (dir / "two.jsonl").string())), 0)
      << test::slurp(dir / "err.txt");
  EXPECT_NE(test::slurp(dir / "out.txt").find("data parallel over MPI"), std::string::npos);
  const std::vector<json> one = lines(dir / "one.jsonl"), two = lines(dir / "two.jsonl");
  ASSERT_EQ(one.size(), two.size());  // rank 0 alone wrote the log: each step once
  int steps = 0, evals = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    ASSERT_EQ(one[i]["step"], two[i]["step"]);
    for (const char* key : {"loss", "val_loss"}) {
      if (!one[i].contains(key)) continue;
      const double a = one[i][key], b = two[i][key];
      EXPECT_LE(std::abs(a - b), 1e-5 * std::abs(a)) << key << " at step " << one[i]["step"];
      (std::string(key) == "loss" ? steps : evals) += 1;
    }
  }
  EXPECT_EQ(steps, 20);
  EXPECT_EQ(evals, 2);
}

// The buckets are summed as the backward finishes them, in rank order: many small buckets
// (overlapped with the backward) and one bucket (after it) give the same losses and the same
// saved weights, bit for bit.
TEST_F(DataParallel, TheBucketSizeChangesNoBit) {
  std::string weights[2];
  std::vector<json> logs[2];
  const char* buckets[2] = {"0.01", "100"};
  for (int i = 0; i < 2; ++i) {
    const fs::path save = dir / fmt::format("ck{}", i), log = dir / fmt::format("l{}.jsonl", i);
    ASSERT_EQ(run(2, "train " + args(2, 6) +
                         fmt::format(" --bucket-mb {} --save '{}' --log '{}'", buckets[i],
                                     save.string(), log.string())),
              0)
        << test::slurp(dir / "err.txt");
    weights[i] = test::slurp(save / "model.safetensors");
    logs[i] = lines(log);
  }
  ASSERT_FALSE(weights[0].empty());
  // Where they first differ (a byte of the header or of which tensor's data), for a failure seen
  // once in CI and not reproduced since.
  const auto diff = std::mismatch(weights[0].begin(), weights[0].end(), weights[1].begin(),
                                  weights[1].end());
  EXPECT_TRUE(weights[0] == weights[1])
      << "the saved weights differ: " << weights[0].size() << " and " << weights[1].size()
      << " bytes, the first difference at byte " << (diff.first - weights[0].begin());
  ASSERT_EQ(logs[0].size(), logs[1].size());
  for (size_t i = 0; i < logs[0].size(); ++i)
    if (logs[0][i].contains("loss")) { EXPECT_EQ(logs[0][i]["loss"], logs[1][i]["loss"]) << i; }
}

TEST_F(DataParallel, ThePlanForTwoRanksIsEachRanksMeasuredPeak) {
  const std::string run_args = args(2, 2) + " --bucket-mb 0.25";
  ASSERT_EQ(run(0, "plan " + run_args + " --ranks 2 --json"), 0) << test::slurp(dir / "err.txt");
  const json plan = json::parse(test::slurp(dir / "out.txt"));
  EXPECT_GT(plan["by_category"]["comm"].get<size_t>(), 0u);  // one bucket's receive buffer
  EXPECT_EQ(plan["ranks"], 2);
  ASSERT_EQ(run(2, "train " + run_args + fmt::format(" --log '{}'", (dir / "p.jsonl").string())),
            0)
      << test::slurp(dir / "err.txt");
  size_t peak = 0;
  for (const json& j : lines(dir / "p.jsonl"))
    if (j.contains("peak_bytes")) peak = std::max(peak, j["peak_bytes"].get<size_t>());
  EXPECT_EQ(peak, plan["peak_bytes"].get<size_t>());
}

}  // namespace
}  // namespace memfit
