// LoRA at ZeRO stage 3 end to end (Note [LoRA], "ZeRO stage 3"), through the built binary under
// `mpirun -n 2`: the frozen base sharded and gathered per block, the adapters replicated and their
// gradients all-reduced. Every step's loss, gradient norm and validation loss is stage 0's bit for
// bit; each rank's measured peak and category bytes are `memfit plan`'s, and each step's
// collective bytes (the adapters' all-reduce, the blocks' gathers, no persistent regather after
// the update: the base is never written); with the base on disk (--offload-params) each rank's
// shard in its file, the same bits and its plan. Skips where memfit was built without MPI.
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

// The frozen base on disk at stage 3 (Note [LoRA], "The frozen base on disk"): each rank's shard
// of it in its file (rank-<r>/), each block's part read, then all-gathered, never written. Every
// step's numbers and every file of the save (the base's shard files streamed from the files, the
// adapters, their state) are those of the base in RAM bit for bit; each rank's peak, categories,
// file and I/O per step (reads alone) are `memfit plan`'s; a save stopped halfway resumes, on
// disk again, to the run in RAM.
TEST_F(LoraZero3, TheBaseOnDiskTrainsAsInRamAndAsPlanned) {
  const std::string disk =
      fmt::format(" --offload-params nvme --offload-dir '{}'", (dir / "offload").string());
  int run = 0;
  for (const std::string& more : {std::string("--lora-dropout 0.1"),
                                 std::string("--precision bf16 --grad-accum 2 --ckpt full")}) {
    const fs::path ram = dir / fmt::format("ram{}", run), off = dir / fmt::format("off{}", run);
    ++run;
    const std::string a = args("llama-tiny", 4, "--zero 3 --repeat-batch " + more);
    auto train_into = [&](const std::string& extra, const fs::path& save) {
      ASSERT_EQ(run_memfit("train " + a + extra +
                               fmt::format(" --save '{}' --log '{}.jsonl'", save.string(),
                                           save.string()),
                           2),
                0)
          << test::slurp(dir / "err.txt");
    };
    train_into("", ram);
    train_into(disk, off);
    const std::vector<json> x = steps_of(ram.string() + ".jsonl"),
                            y = steps_of(off.string() + ".jsonl");
    ASSERT_EQ(x.size(), y.size());
    int steps = 0;
    for (size_t i = 0; i < x.size(); ++i)
      for (const char* key : {"loss", "grad_norm", "val_loss"}) {
        if (!x[i].contains(key)) continue;
        ASSERT_TRUE(y[i].contains(key)) << key << " at line " << i;
        steps += std::string(key) == "loss";
        EXPECT_EQ(x[i][key].get<double>(), y[i][key].get<double>()) << more << " " << key;
        if (std::string(key) == "loss") {
          EXPECT_GT(y[i]["offload"]["params"]["read_bytes"].get<uint64_t>(), 0u);
          EXPECT_EQ(y[i]["offload"]["written_bytes"].get<uint64_t>(), 0u) << "the base written";
          EXPECT_EQ(x[i]["comm_bytes"], y[i]["comm_bytes"]);
        }
      }
    EXPECT_EQ(steps, 4);
    for (const char* f : {"adapter_model.safetensors", "adapter_optimizer.safetensors",
                          "zero-rank-00000-of-00002.safetensors",
                          "zero-rank-00001-of-00002.safetensors", "zero_shards.json",
                          "trainer_state.json"}) {
      const std::string want = test::slurp(ram / f), got = test::slurp(off / f);
      ASSERT_FALSE(want.empty()) << f;
      EXPECT_TRUE(want == got) << more << ": " << f << " differs";
    }
    ASSERT_EQ(run_memfit("plan " + a + disk +
                         fmt::format(" --save '{}' --world-size 2 --json", off.string())),
              0)
        << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    json measured;
    for (const json& j : lines(off.string() + ".jsonl"))
      if (j.contains("ranks")) measured = j["ranks"];
    ASSERT_EQ(measured.size(), 2u);
    for (int r = 0; r < 2; ++r) {
      const json& p = plan["per_rank"][r];
      const json& m = measured[r];
      EXPECT_EQ(m["peak_bytes"], p["peak_bytes"]) << more << " rank " << r;
      EXPECT_EQ(m["mem"], p["by_category"]) << more << " rank " << r;
      EXPECT_GT(p["offload"]["disk_by_category"].value("params", 0), 0);
      EXPECT_EQ(m["offload"]["disk"], p["offload"]["disk_by_category"]) << more << " rank " << r;
      EXPECT_EQ(m["offload"]["io_bytes_per_step"], p["offload"]["io_bytes_per_step"]) << r;
    }
    EXPECT_FALSE(fs::exists(dir / "offload")) << "the files and the directories they were in";
  }
  // The bf16 run saved after 2 steps and resumed to 4, on disk both times: the run in RAM's files.
  const std::string a = args("llama-tiny", 4,
                             "--zero 3 --repeat-batch --precision bf16 --grad-accum 2 --ckpt full");
  const fs::path split = dir / "split";
  ASSERT_EQ(run_memfit("train " + a + disk +
                           fmt::format(" --stop-after 2 --save '{}'", split.string()),
                       2),
            0)
      << test::slurp(dir / "err.txt");
  ASSERT_EQ(run_memfit("train " + a + disk +
                           fmt::format(" --resume '{}' --save '{}'", split.string(),
                                       split.string()),
                       2),
            0)
      << test::slurp(dir / "err.txt");
  for (const char* f : {"adapter_model.safetensors", "adapter_optimizer.safetensors",
                        "zero-rank-00000-of-00002.safetensors",
                        "zero-rank-00001-of-00002.safetensors", "zero_shards.json"})
    EXPECT_TRUE(test::slurp(dir / "ram1" / f) == test::slurp(split / f)) << f << " differs";
}

}  // namespace
}  // namespace memfit
