// LoRA over data-parallel ranks end to end (Note [LoRA], "Over data-parallel ranks"), through the
// built binary under `mpirun -n 2`: two ranks with micro-batch B train the adapters as one
// process with batch 2 B (losses, gradient norms and validation within stated tolerances), the
// bucket size changes no bit of the saved adapters, a resume continues bit for bit, `memfit plan
// --world-size 2` is each rank's measured peak and category bytes, and each step's all-reduced
// bytes, each rank's --profile summary is its plan; ZeRO stages 1-3 are refused before the first
// step, saying why. Skips where memfit was built without MPI.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
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

class LoraDataParallel : public test::MpiBinaryTest {
 protected:
  LoraDataParallel() : MpiBinaryTest(4545) {}
  std::string args(const std::string& model, int batch, int steps, const std::string& more) const {
    return fmt::format("--model {} --n-layer 2 --seq-len 32 --batch {} --steps {} --eval-every 5 "
                       "--eval-batches 2 --threads 1 --lr 1e-2 --lora-rank 4 --lora-alpha 8 "
                       "--lora-targets all-linear --data '{}' {}",
                       model, batch, steps, (dir / "data").string(), more);
  }
  std::vector<json> lines(const fs::path& log) const {
    std::vector<json> out;
    std::istringstream in(test::slurp(log));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  // One process with batch 4 against two ranks with batch 2: every step's loss and validation
  // loss within `tol` relative, its gradient norm within `norm_tol`.
  void expect_two_ranks_as_one(const std::string& model, const std::string& more, double tol,
                               double norm_tol) {
    const fs::path one = dir / "one.jsonl", two = dir / "two.jsonl";
    // --repeat-batch: the same rows every step, which the adapters learn (the data is random).
    ASSERT_EQ(run_memfit("train " + args(model, 4, 10, more + " --repeat-batch") + fmt::format(" --log '{}'", one.string())), 0)
        << test::slurp(dir / "err.txt");
    ASSERT_EQ(run_memfit("train " + args(model, 2, 10, more + " --repeat-batch") + fmt::format(" --log '{}'", two.string()), 2), 0)
        << test::slurp(dir / "err.txt");
    // The step lines (two ranks' last line adds every rank's peak).
    auto steps_of = [&](const fs::path& log) {
      std::vector<json> out;
      for (const json& j : lines(log))
        if (j.contains("step")) out.push_back(j);
      return out;
    };
    const std::vector<json> a = steps_of(one), b = steps_of(two);
    ASSERT_EQ(a.size(), b.size());  // rank 0 alone wrote the log
    int steps = 0, evals = 0;
    double first = 0, last = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i]["step"], b[i]["step"]);
      for (const char* key : {"loss", "grad_norm", "val_loss"}) {
        if (!a[i].contains(key)) continue;
        const double x = a[i][key], y = b[i][key];
        const double t = std::string(key) == "grad_norm" ? norm_tol : tol;
        EXPECT_LE(std::abs(x - y), t * std::abs(x)) << model << " " << key << " at step " << a[i]["step"];
        if (std::string(key) == "val_loss") ++evals;
        if (std::string(key) == "loss") {
          if (steps++ == 0) first = x;
          last = x;
        }
      }
    }
    EXPECT_EQ(steps, 10);
    EXPECT_EQ(evals, 2);
    EXPECT_LT(last, first) << "the adapters did not learn";  // so the comparison is not of a frozen model
  }
};

// fp32: the sums differ from one process's only in their order (measured: 1e-7 relative).
TEST_F(LoraDataParallel, TwoRanksTrainAsOneProcessWithTwiceTheBatch) {
  expect_two_ranks_as_one("gpt2-tiny", "", 1e-5, 1e-5);
  expect_two_ranks_as_one("llama-tiny", "", 1e-5, 1e-5);
}

// bf16 base: step 1 agrees as fp32 does (6e-9); then the adapters' f32 gradient sums, which
// differ in their order alone, move a few activations across a bf16 rounding boundary, and the
// next steps differ by those roundings (measured over 10 steps: losses 3e-5 relative, gradient
// norms 1.3e-3).
TEST_F(LoraDataParallel, TwoRanksTrainAsOneProcessInBf16) {
  expect_two_ranks_as_one("llama-tiny", "--precision bf16", 2e-4, 1e-2);
}

// The adapters' buckets are summed in rank order: many small buckets and one bucket give the
// same saved adapters, bit for bit.
TEST_F(LoraDataParallel, TheBucketSizeChangesNoBit) {
  std::string adapters[2];
  const char* buckets[2] = {"0.001", "100"};
  for (int i = 0; i < 2; ++i) {
    const fs::path save = dir / fmt::format("ck{}", i);
    ASSERT_EQ(run_memfit("train " + args("gpt2-tiny", 2, 4, fmt::format("--lora-dropout 0.2 --bucket-mb {} --save '{}'",
                                                                      buckets[i], save.string())),
                         2),
              0)
        << test::slurp(dir / "err.txt");
    adapters[i] = test::slurp(save / "adapter_model.safetensors");
  }
  ASSERT_FALSE(adapters[0].empty());
  EXPECT_TRUE(adapters[0] == adapters[1]);
}

// Each rank's measured peak and category bytes are its plan's, and each step all-reduces the
// adapters' gradients alone (the frozen base has none): fp32 and bf16, with dropout.
TEST_F(LoraDataParallel, ThePlanIsEachRanksMeasuredPeak) {
  for (const char* more : {"--lora-dropout 0.1", "--precision bf16 --lora-dropout 0.1"}) {
    const std::string a = args("llama-tiny", 2, 2, std::string("--bucket-mb 0.001 ") + more);
    ASSERT_EQ(run_memfit("plan " + a + " --world-size 2 --json"), 0) << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    ASSERT_EQ(plan["per_rank"].size(), 2u);
    EXPECT_GT(plan["comm_per_step"]["all_reduce"].get<int64_t>(), 0);
    const fs::path log = dir / "p.jsonl";
    ASSERT_EQ(run_memfit("train " + a + fmt::format(" --log '{}'", log.string()), 2), 0)
        << test::slurp(dir / "err.txt");
    json measured;
    int steps = 0;
    for (const json& j : lines(log)) {
      if (j.contains("ranks")) measured = j["ranks"];
      if (!j.contains("loss")) continue;
      ++steps;
      for (const char* c : {"all_reduce", "reduce_scatter", "all_gather"})
        EXPECT_EQ(j["comm_bytes"][c], plan["comm_per_step"][c]) << c << " " << more;
    }
    EXPECT_EQ(steps, 2);
    ASSERT_EQ(measured.size(), 2u) << "no per-rank peaks in the log";
    for (int r = 0; r < 2; ++r) {
      const json& p = plan["per_rank"][r];
      EXPECT_EQ(measured[r]["peak_bytes"], p["peak_bytes"]) << more << " rank " << r;
      for (const char* c : {"params", "master", "grads", "optimizer", "comm"})
        EXPECT_EQ(measured[r]["mem"].value(c, size_t{0}), p["by_category"].value(c, size_t{0}))
            << c << " " << more << " rank " << r;
    }
  }
}

// Two ranks, two steps and a save, then --resume to four: the adapters and their optimizer
// state are byte for byte those of four steps in one go (with dropout: the masks are drawn from
// the step, the micro-batch and the rank alone).
TEST_F(LoraDataParallel, AResumeContinuesBitForBit) {
  const fs::path whole = dir / "whole", split = dir / "split";
  // The split run is the whole run's options stopped after 2 steps (the same schedule).
  const std::string a4 = args("gpt2-tiny", 2, 4, "--lora-dropout 0.2 --grad-accum 2");
  const std::string a2 = a4 + " --stop-after 2";
  ASSERT_EQ(run_memfit("train " + a4 + fmt::format(" --save '{}'", whole.string()), 2), 0)
      << test::slurp(dir / "err.txt");
  ASSERT_EQ(run_memfit("train " + a2 + fmt::format(" --save '{}'", split.string()), 2), 0)
      << test::slurp(dir / "err.txt");
  ASSERT_EQ(run_memfit("train " + a4 + fmt::format(" --resume '{}' --save '{}'", split.string(),
                                                   split.string()),
                       2),
            0)
      << test::slurp(dir / "err.txt");
  for (const char* f : {"adapter_model.safetensors", "adapter_optimizer.safetensors",
                        "model.safetensors"}) {
    const std::string x = test::slurp(whole / f), y = test::slurp(split / f);
    ASSERT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == y) << f << " differs";
  }
}

// --profile under two ranks: each rank's summary has its measured bytes equal to its plan's by
// category, its trace's pool peak is its measured peak, and the adapters' all-reduce is a
// collective slice.
TEST_F(LoraDataParallel, EachRankProfilesItsStep) {
  const fs::path p = dir / "profile";
  ASSERT_EQ(run_memfit("train " + args("llama-tiny", 2, 2, fmt::format("--lora-dropout 0.1 --profile '{}' "
                                                                      "--profile-steps 2",
                                                                      p.string())),
                       2),
            0)
      << test::slurp(dir / "err.txt");
  for (int r = 0; r < 2; ++r) {
    const fs::path rank = p / fmt::format("rank{}", r);
    const json s = json::parse(test::slurp(rank / "summary.json"));
    EXPECT_EQ(s["run"]["rank"], r);
    EXPECT_GT(s["measured"]["by_category"].value("comm", 0), 0) << "rank " << r;
    EXPECT_EQ(s["measured"]["by_category"], s["planned"]["by_category"]) << "rank " << r;
    const json trace = json::parse(test::slurp(rank / "trace.json"));
    size_t total = 0;
    bool collective = false;
    for (const json& e : trace["traceEvents"]) {
      if (e["ph"] == "C" && e["name"] == "pool.total")
        total = std::max(total, e["args"]["bytes"].get<size_t>());
      collective |= e["ph"] == "X" && e.value("cat", "") == "collective";
    }
    EXPECT_EQ(total, s["measured"]["peak_bytes"].get<size_t>()) << "rank " << r;
    EXPECT_TRUE(collective) << "rank " << r;
  }
}

// ZeRO stages 1-2 are refused under two ranks before the first step (exit 2, no log), saying
// why and to give --zero 0; so is --zero auto, and `memfit plan` of the same.
TEST_F(LoraDataParallel, RefusesZeroStagesSayingWhy) {
  for (const char* stage : {"1", "2", "auto"}) {
    const fs::path log = dir / fmt::format("z{}.jsonl", stage);
    // (--zero auto needs a budget to search within.)
    const std::string a = args("gpt2-tiny", 2, 2, fmt::format("--zero {} --mem-limit 1GiB", stage));
    EXPECT_EQ(run_memfit("train " + a + fmt::format(" --log '{}'", log.string()), 2), 2) << stage;
    const std::string err = test::slurp(dir / "err.txt");
    EXPECT_NE(err.find(fmt::format("--zero {} with --lora-rank", stage)), std::string::npos) << err;
    EXPECT_NE(err.find("ive --zero 0"), std::string::npos) << err;  // "Give" or "give"
    EXPECT_FALSE(fs::exists(log) && !test::slurp(log).empty()) << stage << ": a step ran";
    EXPECT_EQ(run_memfit("plan " + a + " --world-size 2"), 2) << stage;
    EXPECT_NE(test::slurp(dir / "err.txt").find("--lora-rank"), std::string::npos) << stage;
  }
}

}  // namespace
}  // namespace memfit
