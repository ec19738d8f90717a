// --pp end to end, through the built binary under mpirun (Note [Pipeline parallel],
// docs/notes/pipeline-parallel.md): LLaMA (untied) cut into 2 and 4 stages, under GPipe and
// 1F1B, gives the losses, gradient norms (clipped by the norm summed over the stages) and
// validation losses of one process with the same --grad-accum, bit for bit; two data ranks of
// two stages give the data-parallel run's losses bit for bit. `memfit plan --pp` is every
// world rank's measured peak, by category, and each stage holds its own parameters alone (the
// stages' parameters tile the model's). What is not built is refused naming the option and the
// values. Skips where memfit was built without MPI.
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

class PipelineParallel : public test::MpiBinaryTest {
 protected:
  PipelineParallel() : MpiBinaryTest(4343) {}
  std::string args(const std::string& more) const {
    const bool model = more.find("--model") != std::string::npos;
    return fmt::format("{}--n-layer 4 --seq-len 32 --batch 2 --threads 1 --data '{}' {}",
                       model ? "" : "--model llama-tiny ", (dir / "data").string(), more);
  }
  std::vector<json> lines(const fs::path& log) const {
    std::vector<json> out;
    std::istringstream in(test::slurp(log));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  // `memfit train more` under `ranks` ranks (0: one process); its log.
  std::vector<json> train(int ranks, const std::string& more, const std::string& name) const {
    const fs::path log = dir / (name + ".jsonl");
    EXPECT_EQ(run_memfit("train " + args(more) + fmt::format(" --log '{}'", log.string()), ranks),
              0)
        << name << ": " << test::slurp(dir / "err.txt");
    return lines(log);
  }
  // The lines of steps and evaluations (a run over several ranks logs their peaks too).
  static std::vector<json> numbers(const std::vector<json>& log) {
    std::vector<json> out;
    for (const json& j : log)
      if (j.contains("loss") || j.contains("val_loss")) out.push_back(j);
    return out;
  }
  // Every step's loss and gradient norm and every validation loss of `got` against `ref`: the
  // same bits (`keys` compared), at least `least` numbers in all.
  static void expect_same(const std::vector<json>& ref_log, const std::vector<json>& got_log,
                          const std::vector<const char*>& keys, const std::string& what,
                          int least = 8) {
    const std::vector<json> ref = numbers(ref_log), got = numbers(got_log);
    EXPECT_EQ(ref.size(), got.size()) << what;
    int compared = 0;
    for (size_t i = 0; i < std::min(ref.size(), got.size()); ++i)
      for (const char* key : keys)
        if (ref[i].contains(key)) {
          ASSERT_TRUE(got[i].contains(key)) << what << ": " << key << " at line " << i;
          EXPECT_EQ(ref[i][key].get<double>(), got[i][key].get<double>())
              << what << ": " << key << " at line " << i;
          ++compared;
        }
    EXPECT_GE(compared, least) << what;
  }
};

// Four micro-batches, clipping that binds (the norm over every stage decides it), a validation
// loss every two steps (its forwards through the stages).
constexpr const char* kSteps =
    "--steps 4 --grad-accum 4 --clip 0.05 --eval-every 2 --eval-batches 2";

TEST_F(PipelineParallel, TwoAndFourStagesGiveOneProcesssNumbersBitForBit) {
  const auto ref = train(0, kSteps, "one");
  for (const char* schedule : {"1f1b", "gpipe"}) {
    const std::string s = fmt::format("{} --pp-schedule {}", kSteps, schedule);
    expect_same(ref, train(2, s + " --pp 2", fmt::format("pp2-{}", schedule)),
                {"loss", "grad_norm", "val_loss"}, fmt::format("--pp 2 {}", schedule));
    expect_same(ref, train(4, s + " --pp 4", fmt::format("pp4-{}", schedule)),
                {"loss", "grad_norm", "val_loss"}, fmt::format("--pp 4 {}", schedule));
  }
  // An uneven cut, and recomputation inside the stages.
  expect_same(ref, train(2, std::string(kSteps) + " --pp 2 --pp-layers 1,3", "pp2-13"),
              {"loss", "grad_norm", "val_loss"}, "--pp 2 --pp-layers 1,3");
  const std::string full = std::string(kSteps) + " --ckpt full";
  expect_same(train(0, full, "one-full"), train(2, full + " --pp 2", "pp2-full"),
              {"loss", "grad_norm", "val_loss"}, "--pp 2 --ckpt full");
}

// Two data ranks of two stages each: the data-parallel run's losses bit for bit (two ranks sum
// in either order alike). The norm adds each stage's data shards, not the data-parallel run's
// shards, so it agrees to rounding; without clipping the updates are the same.
TEST_F(PipelineParallel, TwoDataRanksOfTwoStagesMatchDataParallelism) {
  const std::string a = "--steps 3 --grad-accum 2 --clip 0 --eval-every 3 --eval-batches 1";
  const auto dp = train(2, a, "dp2"), both = train(4, a + " --pp 2", "dp2pp2");
  expect_same(dp, both, {"loss", "val_loss"}, "2 data x 2 stages", 4);
  const std::vector<json> x = numbers(dp), y = numbers(both);
  for (size_t i = 0; i < std::min(x.size(), y.size()); ++i)
    if (x[i].contains("grad_norm")) {
      const double u = x[i]["grad_norm"].get<double>(), v = y[i]["grad_norm"].get<double>();
      EXPECT_LE(std::abs(u - v), 1e-6 * std::abs(u)) << "grad_norm at line " << i;
    }
}

// Every world rank's measured peak is its stage's plan (world rank q = data rank x pp + stage),
// by category; the stages' parameters tile the model, and each stage's model state is less than
// the whole model's.
TEST_F(PipelineParallel, ThePlanIsEveryRanksMeasuredPeak) {
  ASSERT_EQ(run_memfit(fmt::format("plan {} --json", args("--steps 2 --grad-accum 4"))), 0)
      << test::slurp(dir / "err.txt");
  const json whole = json::parse(test::slurp(dir / "out.txt"));
  for (const auto& [ranks, more] : std::vector<std::pair<int, std::string>>{
           {2, "--pp 2"},
           {4, "--pp 4 --pp-schedule gpipe"},
           {4, "--pp 4 --ckpt full"},
           {4, "--pp 2"},
           {2, "--pp 2 --pp-layers 3,1 --optim sgd"}}) {
    const std::string a = args("--steps 2 --grad-accum 4 " + more);
    ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size {} --json", a, ranks)), 0)
        << more << ": " << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    const int P = plan["pp"].get<int>();
    ASSERT_EQ(plan["per_rank"].size(), size_t(ranks)) << more;
    ASSERT_EQ(plan["stages"].size(), size_t(P)) << more;
    int64_t params = 0;
    for (const json& s : plan["stages"]) {
      params += s["params"].get<int64_t>();
      EXPECT_LT(s["model_state_bytes"].get<size_t>(), whole["model_state_bytes"].get<size_t>())
          << more << ", stage " << s["stage"];
    }
    EXPECT_EQ(params, whole["model"]["params"].get<int64_t>()) << more;
    EXPECT_EQ(plan["whole_model_params"], whole["model"]["params"]) << more;
    // The run takes the plan's cut: --pp-layers auto balances the stages by this machine's
    // calibration, which a later process may measure again (Note [Step-time model]).
    std::string cut = more;
    if (more.find("--pp-layers") == std::string::npos) {
      std::string counts;
      std::istringstream ranges(plan["pp_layers"].get<std::string>());
      for (std::string r; std::getline(ranges, r, ',');) {
        const size_t dash = r.find('-');
        counts += fmt::format("{}{}", counts.empty() ? "" : ",",
                              std::stoi(r.substr(dash + 1)) - std::stoi(r.substr(0, dash)) + 1);
      }
      cut += " --pp-layers " + counts;
    }
    const auto log = train(ranks, "--steps 2 --grad-accum 4 " + cut, "plan");
    json measured;
    int steps = 0;
    for (const json& j : log) {
      if (j.contains("ranks")) measured = j["ranks"];
      if (j.contains("loss")) ++steps;
    }
    EXPECT_EQ(steps, 2) << more;
    ASSERT_EQ(measured.size(), size_t(ranks)) << "no per-rank peaks in the log";
    for (int q = 0; q < ranks; ++q) {
      const json& p = plan["per_rank"][q];
      EXPECT_EQ(p["rank"], q);
      EXPECT_EQ(p["stage"], q % P);
      EXPECT_EQ(measured[q]["peak_bytes"], p["peak_bytes"]) << more << ", rank " << q;
      for (const char* c :
           {"params", "grads", "optimizer", "activations", "workspace", "comm", "staging"})
        EXPECT_EQ(measured[q]["mem"].value(c, size_t{0}), p["by_category"].value(c, size_t{0}))
            << c << ", " << more << ", rank " << q;
    }
  }
}

TEST_F(PipelineParallel, RefusesWhatIsNotBuiltNamingTheValues) {
  auto refused = [&](const std::string& more, const std::vector<std::string>& says) {
    const int code = run_memfit("plan " + args("--steps 2 --grad-accum 4 " + more));
    EXPECT_NE(code, 0) << more;
    const std::string err = test::slurp(dir / "err.txt");
    for (const std::string& s : says) EXPECT_NE(err.find(s), std::string::npos) << more << ": " << err;
  };
  refused("--world-size 3 --pp 2", {"--pp 2", "must divide the ranks (3)"});
  refused("--world-size 2 --pp 2 --pp-layers 3,2", {"--pp-layers", "3,2"});
  refused("--world-size 2 --pp 2 --pp-schedule interleaved", {"--pp-schedule", "interleaved"});
  refused("--world-size 2 --pp 2 --ckpt every:3", {"--ckpt every:3", "blocks 0-2", "--pp 2"});
  refused("--world-size 2 --pp-layers 2,2", {"--pp-layers 2,2", "needs --pp"});
  refused("--world-size 2 --pp 2 --auto --mem-limit 1GiB", {"--pp 2", "--ckpt auto"});
  // train refuses before the first step, every rank alike.
  EXPECT_NE(run_memfit("train " + args(fmt::format("--steps 2 --pp 2 --offload-optimizer nvme "
                                                   "--offload-grads nvme --offload-dir '{}'",
                                                   (dir / "off").string())),
                       2),
            0);
  EXPECT_NE(test::slurp(dir / "err.txt").find("--pp 2 with --offload-grads"), std::string::npos)
      << test::slurp(dir / "err.txt");
}

}  // namespace
}  // namespace memfit
