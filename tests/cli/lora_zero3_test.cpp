// LoRA at ZeRO stage 3 end to end (Note [LoRA], "ZeRO stage 3"), through the built binary under
// `mpirun -n 2`: the frozen base sharded and gathered per block, the adapters replicated and their
// gradients all-reduced. Every step's loss, gradient norm and validation loss is stage 0's bit for
// bit; each rank's measured peak and category bytes are `memfit plan`'s, and each step's
// collective bytes (the adapters' all-reduce, the blocks' gathers, no persistent regather after
// the update: the base is never written). Skips where memfit was built without MPI.
#include <gtest/gtest.h>

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

class LoraZero3 : public test::MpiBinaryTest {
 protected:
  LoraZero3() : MpiBinaryTest(4546) {}
  std::string args(const std::string& model, int steps, const std::string& more) const {
    return fmt::format("--model {} --n-layer 2 --seq-len 32 --batch 2 --steps {} --eval-every 3 "
                       "--eval-batches 2 --threads 1 --lr 1e-2 --lora-rank 4 --lora-alpha 8 "
                       "--lora-targets all-linear --data '{}' {}",
                       model, steps, (dir / "data").string(), more);
  }
  std::vector<json> lines(const fs::path& log) const {
    std::vector<json> out;
    std::istringstream in(test::slurp(log));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  // The step lines and the evaluations' (the last line adds every rank's peak).
  std::vector<json> steps_of(const fs::path& log) const {
    std::vector<json> out;
    for (const json& j : lines(log))
      if (j.contains("loss") || j.contains("val_loss")) out.push_back(j);
    return out;
  }
  // Stage 0 against stage 3, two ranks each: every step's numbers the same bits.
  void expect_stage3_as_stage0(const std::string& model, const std::string& more) {
    const fs::path z0 = dir / "z0.jsonl", z3 = dir / "z3.jsonl";
    ASSERT_EQ(run_memfit("train " + args(model, 6, more + " --repeat-batch --zero 0") +
                             fmt::format(" --log '{}'", z0.string()),
                         2),
              0)
        << test::slurp(dir / "err.txt");
    ASSERT_EQ(run_memfit("train " + args(model, 6, more + " --repeat-batch --zero 3") +
                             fmt::format(" --log '{}'", z3.string()),
                         2),
              0)
        << test::slurp(dir / "err.txt");
    const std::vector<json> a = steps_of(z0), b = steps_of(z3);
    ASSERT_EQ(a.size(), b.size());
    int evals = 0, steps = 0;
    for (size_t i = 0; i < a.size(); ++i)
      for (const char* key : {"loss", "grad_norm", "val_loss"}) {
        if (!a[i].contains(key)) continue;
        ASSERT_TRUE(b[i].contains(key)) << key << " at line " << i;
        evals += std::string(key) == "val_loss";
        steps += std::string(key) == "loss";
        EXPECT_EQ(a[i][key].get<double>(), b[i][key].get<double>())
            << model << " " << more << " " << key << " at step " << a[i]["step"];
      }
    EXPECT_EQ(steps, 6);
    EXPECT_EQ(evals, 2);
    std::vector<json> sa, sb;  // the step lines alone
    for (size_t i = 0; i < a.size(); ++i)
      if (a[i].contains("loss")) sa.push_back(a[i]), sb.push_back(b[i]);
    EXPECT_LT(sa.back()["loss"].get<double>(), sa.front()["loss"].get<double>())
        << "the adapters did not learn";
    // Stage 3 gathered blocks every step; stage 0 gathered nothing.
    EXPECT_GT(sb.front()["comm_bytes"]["all_gather"].get<int64_t>(), 0);
    EXPECT_EQ(sa.front()["comm_bytes"]["all_gather"].get<int64_t>(), 0);
  }
};

// fp32 in both families, and a bf16 base: the gathers move bytes, the adapters' sums are stage
// 0's in rank order, so nothing differs.
TEST_F(LoraZero3, StageThreeTrainsAsStageZeroBitForBit) {
  expect_stage3_as_stage0("gpt2-tiny", "");
  expect_stage3_as_stage0("llama-tiny", "--lora-dropout 0.1");
  expect_stage3_as_stage0("llama-tiny", "--precision bf16 --prefetch-depth 0 --ckpt full");
}

// Each rank's measured peak and category bytes are its plan's (its shard of the base, the
// gathered units' buffers, the adapters' receive ring; with a save of the base's shards), and
// each step's collectives as planned.
TEST_F(LoraZero3, ThePlanIsEachRanksMeasuredPeak) {
  const std::string save = fmt::format("--save '{}'", (dir / "saved").string());
  for (const std::string& more : {"--lora-dropout 0.1 " + save,
                                  std::string("--precision bf16 --grad-accum 2")}) {
    const std::string a = args("llama-tiny", 2, "--zero 3 --bucket-mb 0.001 " + more);
    ASSERT_EQ(run_memfit("plan " + a + " --world-size 2 --json"), 0) << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    ASSERT_EQ(plan["per_rank"].size(), 2u);
    EXPECT_GT(plan["comm_per_step"]["all_gather"].get<int64_t>(), 0);
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
      for (const char* c : {"params", "master", "grads", "optimizer", "comm", "staging"})
        EXPECT_EQ(measured[r]["mem"].value(c, size_t{0}), p["by_category"].value(c, size_t{0}))
            << c << " " << more << " rank " << r;
    }
  }
}

// Two steps saved and resumed to four at stage 3: the adapters, their optimizer state and the
// base's shard files byte for byte as four steps in one go; and the base's shard files are
// those of a run of no steps (the frozen base is never written), which the resume read back.
TEST_F(LoraZero3, AResumeContinuesBitForBitAndTheBaseIsUnchanged) {
  const fs::path whole = dir / "whole", split = dir / "split", none = dir / "none";
  const std::string a4 = args("gpt2-tiny", 4, "--zero 3 --lora-dropout 0.2 --grad-accum 2");
  ASSERT_EQ(run_memfit("train " + a4 + fmt::format(" --save '{}'", whole.string()), 2), 0)
      << test::slurp(dir / "err.txt");
  ASSERT_EQ(run_memfit("train " + a4 + fmt::format(" --stop-after 2 --save '{}'", split.string()), 2),
            0)
      << test::slurp(dir / "err.txt");
  ASSERT_EQ(run_memfit("train " + a4 + fmt::format(" --resume '{}' --save '{}'", split.string(),
                                                   split.string()),
                       2),
            0)
      << test::slurp(dir / "err.txt");
  ASSERT_EQ(run_memfit("train " + args("gpt2-tiny", 0, "--zero 3") +
                           fmt::format(" --save '{}'", none.string()),
                       2),
            0)
      << test::slurp(dir / "err.txt");
  EXPECT_FALSE(fs::exists(whole / "model.safetensors")) << "no rank holds the base whole";
  for (const char* f : {"adapter_model.safetensors", "adapter_optimizer.safetensors",
                        "zero-rank-00000-of-00002.safetensors",
                        "zero-rank-00001-of-00002.safetensors", "zero_shards.json"}) {
    const std::string x = test::slurp(whole / f), y = test::slurp(split / f);
    ASSERT_FALSE(x.empty()) << f;
    EXPECT_TRUE(x == y) << f << " differs";
  }
  EXPECT_NE(test::slurp(whole / "adapter_model.safetensors"),
            test::slurp(none / "adapter_model.safetensors"));
  for (const char* f : {"zero-rank-00000-of-00002.safetensors",
                        "zero-rank-00001-of-00002.safetensors"})
    EXPECT_TRUE(test::slurp(whole / f) == test::slurp(none / f)) << f << ": the base changed";
}

}  // namespace
}  // namespace memfit
