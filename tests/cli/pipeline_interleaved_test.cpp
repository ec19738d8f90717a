// --pp-schedule interleaved end to end, through the built binary under mpirun (Note [Pipeline
// parallel], "Interleaved"): every rank holds --pp-virtual chunks (virtual stage c x P + r), and
// Megatron's interleaved order runs each chunk's micro-batches in order, so LLaMA (untied) at
// pp 2 and 4, V 2 and 3, gives the losses, gradient norms (clipped by the norm added in
// virtual-stage order) and validation losses of one process with the same --grad-accum, bit for
// bit; GPT-2 (tied: the table on rank 0's first chunk, its copy on rank P - 1's last) within
// 1e-6; two data ranks of two stages (ZeRO 0 and 1) the data-parallel run's losses. The plan is
// every rank's measured peak by category. Saves are one process's files and resume at any
// layout. What is not built is refused naming the values. Skips where memfit was built without
// MPI.
#include <gtest/gtest.h>

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

class PipelineInterleaved : public test::MpiBinaryTest {
 protected:
  PipelineInterleaved() : MpiBinaryTest(4344) {}
  std::string args(const std::string& more) const {
    const bool model = more.find("--model") != std::string::npos;
    const bool layers = more.find("--n-layer") != std::string::npos;
    return fmt::format("{}{}--seq-len 32 --batch 2 --threads 1 --data '{}' {}",
                       model ? "" : "--model llama-tiny ", layers ? "" : "--n-layer 4 ",
                       (dir / "data").string(), more);
  }
  // `memfit train more` under `ranks` ranks (0: one process); its lines of steps and
  // evaluations.
  std::vector<json> train(int ranks, const std::string& more, const std::string& name) const {
    const fs::path log = dir / (name + ".jsonl");
    EXPECT_EQ(run_memfit("train " + args(more) + fmt::format(" --log '{}'", log.string()), ranks),
              0)
        << name << ": " << test::slurp(dir / "err.txt");
    std::vector<json> out;
    std::istringstream in(test::slurp(log));
    for (std::string line; std::getline(in, line);) {
      const json j = json::parse(line);
      if (j.contains("loss") || j.contains("val_loss")) out.push_back(j);
    }
    return out;
  }
  // `keys` of every line of `got` against `ref`: the same bits (tolerance 0), or within
  // `relative`; at least `least` numbers compared.
  static void expect_same(const std::vector<json>& ref, const std::vector<json>& got,
                          const std::vector<const char*>& keys, const std::string& what,
                          int least = 8, double relative = 0) {
    EXPECT_EQ(ref.size(), got.size()) << what;
    int compared = 0;
    for (size_t i = 0; i < std::min(ref.size(), got.size()); ++i)
      for (const char* key : keys)
        if (ref[i].contains(key)) {
          ASSERT_TRUE(got[i].contains(key)) << what << ": " << key << " at line " << i;
          const double u = ref[i][key].get<double>(), v = got[i][key].get<double>();
          if (relative == 0)
            EXPECT_EQ(u, v) << what << ": " << key << " at line " << i;
          else
            EXPECT_LE(std::abs(u - v), relative * std::abs(u)) << what << ": " << key << " at line " << i;
          ++compared;
        }
    EXPECT_GE(compared, least) << what;
  }
};

// Four micro-batches, clipping that binds (the norm over every chunk decides it), a validation
// loss every two steps (its forwards through the virtual stages).
constexpr const char* kSteps =
    "--steps 4 --grad-accum 4 --clip 0.05 --eval-every 2 --eval-batches 2";

TEST_F(PipelineInterleaved, LlamaGivesOneProcesssNumbersBitForBit) {
  const std::vector<const char*> keys = {"loss", "grad_norm", "val_loss"};
  const std::string s = std::string(kSteps) + " --pp-schedule interleaved";
  const auto ref4 = train(0, kSteps, "one4");
  expect_same(ref4, train(2, s + " --pp 2 --pp-virtual 2", "pp2v2"), keys, "--pp 2 V 2");
  const std::string six = std::string(kSteps) + " --n-layer 6";
  expect_same(train(0, six, "one6"),
              train(2, six + " --pp-schedule interleaved --pp 2 --pp-virtual 3", "pp2v3"), keys,
              "--pp 2 V 3");
  const std::string eight = std::string(kSteps) + " --n-layer 8";
  expect_same(train(0, eight, "one8"),
              train(4, eight + " --pp-schedule interleaved --pp 4 --pp-virtual 2", "pp4v2"),
              keys, "--pp 4 V 2");
  // bf16 (master weights, and pure) and fp16 (the loss scale, every chunk unscaled alike).
  for (const char* p : {"--precision bf16", "--precision bf16 --master-weights none",
                        "--precision fp16"}) {
    const std::string a = std::string(kSteps) + " " + p;
    expect_same(train(0, a, "one-half"),
                train(2, a + " --pp-schedule interleaved --pp 2 --pp-virtual 2", "pp2v2-half"),
                {"loss", "grad_norm", "val_loss", "loss_scale"}, p);
  }
}

// Tied (GPT-2): the table's gradient is the first chunk's and the last chunk's parts added once
// after the backward, one process's up to float rounding (as 1F1B's: tests/cli/
// pipeline_tied_test.cpp), so within 1e-6 relative.
TEST_F(PipelineInterleaved, TiedGpt2IsOneProcessWithinTolerance) {
  const std::string g = std::string(kSteps) + " --model gpt2-tiny --n-layer 4";
  expect_same(train(0, g, "gpt2"),
              train(2, g + " --pp-schedule interleaved --pp 2 --pp-virtual 2", "gpt2-pp2v2"),
              {"loss", "grad_norm", "val_loss"}, "GPT-2 --pp 2 V 2", 8, 1e-6);
}

// Two data ranks of two stages of two chunks: the data-parallel run's losses bit for bit; the
// norm adds each chunk's data shards, so it agrees to rounding (no clipping: the same updates).
TEST_F(PipelineInterleaved, TwoDataRanksMatchDataParallelism) {
  const std::string a = "--steps 3 --grad-accum 2 --clip 0 --eval-every 3 --eval-batches 1";
  for (int zero : {0, 1, 2, 3}) {
    // (ZeRO 2-3 reduce each micro-batch's gradients: the data-parallel run at the same stage.)
    const auto dp = train(2, a + fmt::format(" --zero {}", zero), fmt::format("dp2-z{}", zero));
    const auto got = train(
        4, a + fmt::format(" --zero {} --pp 2 --pp-schedule interleaved --pp-virtual 2", zero),
        fmt::format("dp2pp2v2-z{}", zero));
    expect_same(dp, got, {"loss", "val_loss"}, fmt::format("2 data x 2 stages x 2, zero {}", zero),
                4);
    expect_same(dp, got, {"grad_norm"}, fmt::format("grad_norm, zero {}", zero), 3, 1e-6);
  }
  // bf16 gradients (per-unit reductions, one widening buffer a rank), and a tied GPT-2 at ZeRO
  // 2 (the table's shards exchanged between rank 0's first chunk and rank 1's last), within 1e-6.
  const std::string bf = a + " --grad-dtype bf16 --zero 1";
  expect_same(train(2, bf, "dp2-bf16"),
              train(4, bf + " --pp 2 --pp-schedule interleaved --pp-virtual 2", "bf16g"),
              {"loss", "val_loss", "grad_norm"}, "--grad-dtype bf16", 4, 1e-6);
  const std::string g = a + " --model gpt2-tiny";
  expect_same(train(2, g + " --zero 2", "dp2-gpt2"),
              train(4, g + " --zero 2 --pp 2 --pp-schedule interleaved --pp-virtual 2", "gz2"),
              {"loss", "val_loss", "grad_norm"}, "tied GPT-2 at ZeRO 2", 4, 1e-6);
}

// Every world rank's measured peak is its plan (world rank q = data rank x pp + stage), by
// category: its chunks' model state, arenas and exchanges, and the runner's buffers over its
// chunks; the ranks' parameters tile the model; the step has m V + p - 1 slots and the bubble
// (p - 1)/(V m).
TEST_F(PipelineInterleaved, ThePlanIsEveryRanksMeasuredPeak) {
  ASSERT_EQ(run_memfit(fmt::format("plan {} --json", args("--steps 2 --grad-accum 4"))), 0)
      << test::slurp(dir / "err.txt");
  const json whole = json::parse(test::slurp(dir / "out.txt"));
  for (const auto& [ranks, more] : std::vector<std::pair<int, std::string>>{
           {2, "--pp 2 --pp-virtual 2"},
           {4, "--pp 4 --pp-virtual 2 --n-layer 8"},
           {2, "--pp 2 --pp-virtual 2 --model gpt2-tiny --ckpt full"},
           {2, "--pp 2 --pp-virtual 2 --precision bf16 --master-weights none"},
           {4, "--pp 2 --pp-virtual 2 --zero 1"},
           {4, "--pp 2 --pp-virtual 2 --zero 3"},
           {4, "--pp 2 --pp-virtual 2 --zero 2 --model gpt2-tiny"},
           {4, "--pp 2 --pp-virtual 2 --tp 2 --sp"},
           {2, "--pp 2 --pp-virtual 2 --grad-dtype bf16"},
           {2, "--pp 2 --pp-virtual 2 --n-layer 6 --pp-layers 2,1,1,2"}}) {
    const std::string a = "--steps 2 --grad-accum 4 --pp-schedule interleaved " + more;
    ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size {} --json", args(a), ranks)), 0)
        << more << ": " << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    const int P = plan["pp"].get<int>();
    ASSERT_EQ(plan["per_rank"].size(), size_t(ranks)) << more;
    ASSERT_EQ(plan["stages"].size(), size_t(P)) << more;
    EXPECT_EQ(plan["pp_virtual"].get<int>(), 2) << more;
    const json& t = plan["pipeline_time"];
    EXPECT_EQ(t["slots"].get<int>(), 4 * 2 + P - 1) << more;
    EXPECT_DOUBLE_EQ(t["bubble_fraction"].get<double>(), (P - 1) / 8.0) << more;
    if (more.find("gpt2") == std::string::npos && more.find("n-layer") == std::string::npos &&
        more.find("bf16") == std::string::npos && more.find("--tp") == std::string::npos) {
      int64_t params = 0;
      for (const json& s : plan["stages"]) params += s["params"].get<int64_t>();
      EXPECT_EQ(params, whole["model"]["params"].get<int64_t>()) << more;
    }
    int steps = 0;
    for (const json& j : train(ranks, a, "plan")) steps += j.contains("loss");
    EXPECT_EQ(steps, 2) << more;
    json measured;
    std::istringstream in(test::slurp(dir / "plan.jsonl"));
    for (std::string line; std::getline(in, line);)
      if (const json j = json::parse(line); j.contains("ranks")) measured = j["ranks"];
    ASSERT_EQ(measured.size(), size_t(ranks)) << "no per-rank peaks in the log";
    for (int q = 0; q < ranks; ++q) {
      const json& p = plan["per_rank"][q];
      const int TP = more.find("--tp 2") != std::string::npos ? 2 : 1;
      EXPECT_EQ(p["stage"], (q / TP) % P);
      EXPECT_EQ(measured[q]["peak_bytes"], p["peak_bytes"]) << more << ", rank " << q;
      for (const char* c :
           {"params", "grads", "optimizer", "activations", "workspace", "comm", "staging"})
        EXPECT_EQ(measured[q]["mem"].value(c, size_t{0}), p["by_category"].value(c, size_t{0}))
            << c << ", " << more << ", rank " << q;
    }
  }
}

TEST_F(PipelineInterleaved, RefusesWhatIsNotBuiltNamingTheValues) {
  auto refused = [&](const std::string& more, const std::vector<std::string>& says) {
    const bool accum = more.find("--grad-accum") != std::string::npos;
    const int code =
        run_memfit("plan " + args(std::string("--steps 1 ") + (accum ? "" : "--grad-accum 4 ") + more));
    EXPECT_NE(code, 0) << more;
    const std::string err = test::slurp(dir / "err.txt");
    for (const std::string& s : says)
      EXPECT_NE(err.find(s), std::string::npos) << more << ": " << err;
  };
  const std::string i = "--world-size 2 --pp 2 --pp-schedule interleaved ";
  refused(i + "--pp-virtual 2 --grad-accum 3", {"--grad-accum 3", "multiple of --pp 2"});
  refused(i + "--pp-virtual 3", {"--pp 2 x --pp-virtual 3 = 6", "4 blocks"});
  refused(i + "--pp-virtual 1", {"--pp-virtual"});
  refused(i + "--pp-virtual 2 --pp-layers 2,2",
          {"--pp-layers 2,2 gives 2 counts", "--pp 2 x --pp-virtual 2 = 4"});
  refused("--world-size 2 --pp 2 --pp-virtual 2", {"--pp-virtual 2", "interleaved"});
  // train refuses before the first step, every rank alike.
  EXPECT_NE(run_memfit("train " + args("--steps 1 --grad-accum 3 --pp 2 --pp-schedule "
                                       "interleaved --pp-virtual 2"),
                       2),
            0);
  EXPECT_NE(test::slurp(dir / "err.txt").find("multiple of --pp 2"),
            std::string::npos)
      << test::slurp(dir / "err.txt");
}

// Stages of tensor groups (Note [Pipeline parallel], "Stages of tensor groups"): pp 2 x V 2 x
// tp 2, with --sp, against one process within 1e-6 (the norms 3e-6), as 1F1B's tp x pp is
// (tests/cli/pipeline_tensor_parallel_test.cpp); dp 2 x pp 2 x V 2 x tp 2 against the
// data-parallel run.
TEST_F(PipelineInterleaved, StagesOfTensorGroupsMatchOneProcess) {
  const std::string a = kSteps;
  const auto one = train(0, a, "one-tp");
  const std::string iv = " --pp 2 --pp-schedule interleaved --pp-virtual 2 --tp 2";
  for (const char* more : {"", " --sp"}) {
    const auto got = train(4, a + iv + more, "pp2v2tp2");
    expect_same(one, got, {"loss", "val_loss"}, std::string("tp 2") + more, 4, 1e-6);
    expect_same(one, got, {"grad_norm"}, std::string("tp 2 norms") + more, 3, 3e-6);
  }
  const auto both = train(8, a + iv + " --zero 1", "dp2pp2v2tp2");
  expect_same(train(2, a, "dp2-tp"), both, {"loss", "val_loss"}, "dp 2 x pp 2 x V 2 x tp 2", 4,
              1e-6);
}

// Checkpoints (Note [Checkpoints across layouts]): every chunk writes its run of the whole
// tensors, so a save under interleaved is one process's files byte for byte; it resumes under
// 1F1B and in one process (their saves, taking no step, are the same files), a one-process save
// resumes under interleaved, and a run resumed at interleaved continues as if it never stopped.
TEST_F(PipelineInterleaved, SavesAreOneProcesssFilesAndResumeAtAnyLayout) {
  const std::string iv = " --pp 2 --pp-schedule interleaved --pp-virtual 2";
  const std::string two = "--steps 4 --stop-after 2 --grad-accum 4 --clip 0.05";
  auto at = [&](const char* name) { return (dir / name).string(); };
  auto same = [&](const char* x, const char* y) {
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "config.json"}) {
      const std::string a = test::slurp(dir / x / f), b = test::slurp(dir / y / f);
      EXPECT_FALSE(a.empty()) << x << "/" << f;
      EXPECT_TRUE(a == b) << x << "/" << f << " differs from " << y << "'s";
    }
  };
  train(0, fmt::format("{} --save '{}'", two, at("one")), "save-one");
  train(2, fmt::format("{}{} --save '{}'", two, iv, at("iv")), "save-iv");
  same("one", "iv");
  train(2, fmt::format("{} --pp 2 --resume '{}' --save '{}'", two, at("iv"), at("p2")), "p2");
  train(0, fmt::format("{} --resume '{}' --save '{}'", two, at("iv"), at("o1")), "o1");
  train(2, fmt::format("{}{} --resume '{}' --save '{}'", two, iv, at("one"), at("iv2")), "iv2");
  same("iv", "p2");
  same("iv", "o1");
  same("one", "iv2");
  // Tied (GPT-2): the table loaded into rank 0's first chunk and rank 1's last, written once.
  const std::string g = two + " --model gpt2-tiny --n-layer 4";
  train(0, fmt::format("{} --save '{}'", g, at("g1")), "g1");
  train(2, fmt::format("{}{} --resume '{}' --save '{}'", g, iv, at("g1"), at("g2")), "g2");
  same("g1", "g2");
  // Two data ranks at ZeRO 3 (each chunk writes its shard's runs): the data-parallel run's state
  // (its shard files, resumed and saved whole by one process).
  train(2, fmt::format("{} --zero 3 --save '{}'", two, at("d3")), "d3");
  train(4, fmt::format("{}{} --zero 3 --save '{}'", two, iv, at("i3")), "i3");
  train(0, fmt::format("{} --resume '{}' --save '{}'", two, at("d3"), at("o3")), "o3");
  same("o3", "i3");
  const std::string four = "--steps 4 --grad-accum 4 --clip 0.05";
  const auto whole = train(0, four, "whole");
  const auto resumed = train(2, fmt::format("{}{} --resume '{}'", four, iv, at("iv")), "resumed");
  int compared = 0;
  for (const json& r : resumed)
    for (const json& w : whole)
      if (r.contains("loss") && w.contains("loss") && w["step"] == r["step"]) {
        EXPECT_GT(r["step"].get<int>(), 2);
        EXPECT_EQ(w["loss"].get<double>(), r["loss"].get<double>()) << r;
        EXPECT_EQ(w["grad_norm"].get<double>(), r["grad_norm"].get<double>()) << r;
        ++compared;
      }
  EXPECT_EQ(compared, 2);
}

}  // namespace
}  // namespace memfit
