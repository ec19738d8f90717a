// --pp with --tp end to end, through the built binary under mpirun (Note [Pipeline parallel],
// "Stages of tensor groups"): ranks form data x pipeline x tensor, tensor fastest; each stage is
// a tensor group, and each tensor rank sends its copy of the activations (with --sp its rows)
// to the rank of the same tensor index on the next stage. LLaMA (untied: tied embeddings under
// --pp are another change) over 2 stages of 2 tensor ranks, and 2 data x 2 stages x 2 tensor
// ranks, gives the losses and validation losses of one process within 1e-6 relative over 20
// steps, and the gradient norms (clipping that binds) within 3e-6: the tensor group's sums add
// partial products in another order than one GEMM, so not bit for bit. `memfit plan --pp --tp` is every world
// rank's measured peak by category, and each step's tensor collectives on rank 0 (stage 0) are
// its stage's planned ones. A layout that does not divide the ranks or the heads is refused
// naming the values. Skips where memfit was built without MPI.
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

class PipelineTensorParallel : public test::MpiBinaryTest {
 protected:
  PipelineTensorParallel() : MpiBinaryTest(4344) {}
  // `batch`: each rank's micro-batch (one process with 2 x 2 for two data ranks' rows).
  std::string args(const std::string& more, int batch = 2) const {
    return fmt::format("--model llama-tiny --n-layer 4 --seq-len 32 --batch {} --threads 1 "
                       "--data '{}' {}",
                       batch, (dir / "data").string(), more);
  }
  std::vector<json> lines(const fs::path& log) const {
    std::vector<json> out;
    std::istringstream in(test::slurp(log));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  // `memfit train more` under `ranks` ranks (0: one process); its log.
  std::vector<json> train(int ranks, const std::string& more, const std::string& name,
                          int batch = 2) const {
    const fs::path log = dir / (name + ".jsonl");
    EXPECT_EQ(run_memfit("train " + args(more, batch) + fmt::format(" --log '{}'", log.string()),
                         ranks),
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
  // Every step's loss and every validation loss of `got` within 1e-6 relative of `ref`'s, every
  // gradient norm within 3e-6, at least `least` numbers in all; prints the worst differences
  // (the note's measured figures). The norm is looser: each step's is a fresh sum of squares of
  // gradients whose GEMMs the tensor group adds in another order, so it differs by up to about
  // 1e-6 on a step (measured), without drifting over the steps; the losses stay within 1e-7.
  static void expect_close(const std::vector<json>& ref_log, const std::vector<json>& got_log,
                           const std::string& what, int least = 40) {
    const std::vector<json> ref = numbers(ref_log), got = numbers(got_log);
    EXPECT_EQ(ref.size(), got.size()) << what;
    int compared = 0;
    double worst_loss = 0, worst_norm = 0;
    for (size_t i = 0; i < std::min(ref.size(), got.size()); ++i)
      for (const char* key : {"loss", "grad_norm", "val_loss"})
        if (ref[i].contains(key)) {
          ASSERT_TRUE(got[i].contains(key)) << what << ": " << key << " at line " << i;
          const double a = ref[i][key].get<double>(), b = got[i][key].get<double>();
          const bool norm = std::string(key) == "grad_norm";
          EXPECT_LE(std::abs(a - b), (norm ? 3e-6 : 1e-6) * std::abs(a))
              << what << ": " << key << " at line " << i << ": " << b << " against " << a;
          double& worst = norm ? worst_norm : worst_loss;
          worst = std::max(worst, std::abs(a - b) / std::abs(a));
          ++compared;
        }
    fmt::print("{}: worst relative difference {:.3g} (losses), {:.3g} (gradient norms) over {} "
               "numbers\n",
               what, worst_loss, worst_norm, compared);
    EXPECT_GE(compared, least) << what;
  }
  // `memfit plan` and `memfit train --steps 2` with `more` over `ranks` ranks: every world
  // rank's measured peak is its plan (its stage's, data rank's and tensor rank's), by category,
  // and rank 0's tensor collectives each step are stage 0's planned ones. Returns the plan.
  json expect_planned(int ranks, const std::string& more) const {
    const std::string a = args("--steps 2 --grad-accum 4 " + more);
    EXPECT_EQ(run_memfit(fmt::format("plan {} --world-size {} --json", a, ranks)), 0)
        << more << ": " << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    const int P = plan["pp"].get<int>(), TP = plan["tp"].get<int>();
    EXPECT_EQ(plan["per_rank"].size(), size_t(ranks)) << more;
    const auto log = train(ranks, "--steps 2 --grad-accum 4 " + more, "plan");
    json measured;
    int steps = 0;
    for (const json& j : log) {
      if (j.contains("ranks")) measured = j["ranks"];
      if (!j.contains("loss")) continue;
      ++steps;  // rank 0 is stage 0's tensor rank 0: its stage's collectives, as planned
      for (const auto& [k, bytes] : j["tensor_comm_bytes"].items())
        EXPECT_EQ(bytes, plan["stages"][0]["tensor_comm_per_step"].value(k, json()))
            << k << ", " << more;
    }
    EXPECT_EQ(steps, 2) << more;
    EXPECT_EQ(measured.size(), size_t(ranks)) << "no per-rank peaks in the log";
    for (int q = 0; q < std::min<int>(ranks, static_cast<int>(measured.size())); ++q) {
      const json& p = plan["per_rank"][q];
      EXPECT_EQ(p["rank"], q);
      EXPECT_EQ(p["stage"], q / TP % P) << more;
      EXPECT_EQ(p["tensor_rank"], q % TP) << more;
      EXPECT_EQ(p["data_rank"], q / (TP * P)) << more;
      EXPECT_EQ(measured[q]["peak_bytes"], p["peak_bytes"]) << more << ", rank " << q;
      for (const char* c :
           {"params", "grads", "optimizer", "activations", "workspace", "comm", "staging"})
        EXPECT_EQ(measured[q]["mem"].value(c, size_t{0}), p["by_category"].value(c, size_t{0}))
            << c << ", " << more << ", rank " << q;
    }
    return plan;
  }
};

// Four micro-batches, clipping that binds (the norm over the stages and the tensor slices
// decides it), a validation loss every five steps (its forwards through the stages).
constexpr const char* kSteps =
    "--steps 20 --grad-accum 4 --clip 0.05 --eval-every 5 --eval-batches 2";

TEST_F(PipelineTensorParallel, TwoStagesOfTwoTensorRanksMatchOneProcess) {
  const auto ref = train(0, kSteps, "one");
  for (const char* schedule : {"1f1b", "gpipe"})
    expect_close(ref,
                 train(4, fmt::format("{} --pp 2 --tp 2 --pp-schedule {}", kSteps, schedule),
                       fmt::format("pp2tp2-{}", schedule)),
                 fmt::format("--pp 2 --tp 2 --pp-schedule {}", schedule));
  // --sp: each tensor rank sends its rows of the stream to its peer of the next stage.
  expect_close(ref, train(4, std::string(kSteps) + " --pp 2 --tp 2 --sp", "pp2tp2sp"),
               "--pp 2 --tp 2 --sp");
  // One key/value head, replicated on both tensor ranks of each stage (its gradients summed
  // over the pair), and recomputation inside the stages.
  const std::string a = std::string(kSteps) + " --n-kv-head 1 --ckpt full";
  expect_close(train(0, a, "one-kv1"), train(4, a + " --pp 2 --tp 2", "pp2tp2-kv1"),
               "--pp 2 --tp 2, one key/value head, --ckpt full");
  // A tied head (Note [Pipeline parallel], "Tied embeddings"): each tensor rank's slice of the
  // table on the first stage, its copy on the last (drawn as the table's slice), the pair's
  // gradients summed, the copy's squares not counted in the norm.
  const std::string t = std::string(kSteps) + " --tie-embeddings true";
  expect_close(train(0, t, "one-tied"), train(4, t + " --pp 2 --tp 2", "pp2tp2-tied"),
               "--pp 2 --tp 2, a tied head");
}

// fp8 with its linears stored as E4M3 codes at pp 2 x tp 2 (Note [FP8], "Under --tp and
// --pp"): each stage's tensor ranks agree on its matrices' scales, so the codes decode to the
// values the bf16 working weights cast to (kept where the optimizer is offloaded), and the
// losses, norms and validation losses are those of the cast run bit for bit.
TEST_F(PipelineTensorParallel, Fp8StoredCodesGiveTheCastWeightsBits) {
  const std::string a = "--steps 4 --grad-accum 4 --clip 0.05 --eval-every 2 --eval-batches 2 "
                        "--precision fp8 --pp 2 --tp 2";
  const auto stored = numbers(train(4, a, "stored"));
  const std::string err = test::slurp(dir / "err.txt");
  EXPECT_NE(err.find("stored as E4M3 codes, one byte each, with a scale per matrix, each "
                     "pipeline stage its own matrices, each of the --tp 2 ranks its slice"),
            std::string::npos)
      << err;
  const auto cast = numbers(train(
      4, fmt::format("{} --offload-optimizer nvme --offload-dir '{}'", a, (dir / "off").string()),
      "cast"));
  ASSERT_EQ(stored.size(), cast.size());
  int compared = 0;
  for (size_t i = 0; i < stored.size(); ++i)
    for (const char* key : {"loss", "grad_norm", "val_loss"})
      if (cast[i].contains(key)) {
        EXPECT_EQ(stored[i].value(key, 0.0), cast[i][key].get<double>()) << key << " " << i;
        ++compared;
      }
  EXPECT_EQ(compared, 10);
}

// 2 data x 2 stages x 2 tensor ranks (8 ranks on 2 cores): one process reading the same rows
// (batch 2 x 2).
TEST_F(PipelineTensorParallel, TwoDataRanksOfTwoStagesOfTwoTensorRanksMatchOneProcess) {
  expect_close(train(0, kSteps, "one", 4), train(8, std::string(kSteps) + " --pp 2 --tp 2", "3d"),
               "2 data x 2 pipeline x 2 tensor");
}

// Every world rank's measured peak is its plan, by category, and rank 0's tensor collectives
// are stage 0's. 4 blocks over 2 stages, 4 micro-batches: stage 0 (no head) runs each forward
// twice, so 2 embedding all-reduces, 2 x 2 blocks x 2 forward ones and 2 blocks x 2 backward
// ones a micro-batch (14); stage 1 the LM head's d(norm), 2 blocks x 2 forward and x 2
// backward (9).
TEST_F(PipelineTensorParallel, ThePlanIsEveryRanksMeasuredPeak) {
  for (const auto& [ranks, more] : std::vector<std::pair<int, std::string>>{
           {4, "--pp 2 --tp 2"},
           {4, "--pp 2 --tp 2 --pp-schedule gpipe --n-kv-head 1"},
           {4, "--pp 2 --tp 2 --sp --ckpt full"},
           {4, "--pp 2 --tp 2 --tie-embeddings true"},
           {4, "--pp 2 --tp 2 --precision fp8"},
           {8, "--pp 2 --tp 2"}}) {
    const json plan = expect_planned(ranks, more);
    ASSERT_EQ(plan["stages"].size(), 2u) << more;
    const bool sp = more.find("--sp") != std::string::npos;
    const bool full = more.find("full") != std::string::npos;
    const char* count = sp ? "reduce_scatter_count" : "all_reduce_count";
    EXPECT_EQ(plan["stages"][0]["tensor_comm_per_step"][count].get<int>(),
              4 * (14 + (full ? 4 : 0)))
        << more;
    EXPECT_EQ(plan["stages"][1]["tensor_comm_per_step"][count].get<int>(),
              4 * (9 + (full ? 4 : 0)))
        << more;
  }
}

TEST_F(PipelineTensorParallel, RefusesALayoutThatDoesNotDivideNamingTheValues) {
  auto refused = [&](const std::string& more, const std::vector<std::string>& says) {
    const int code = run_memfit("plan " + args("--steps 2 --grad-accum 4 " + more));
    EXPECT_NE(code, 0) << more;
    const std::string err = test::slurp(dir / "err.txt");
    for (const std::string& s : says)
      EXPECT_NE(err.find(s), std::string::npos) << more << ": " << err;
  };
  refused("--world-size 6 --pp 2 --tp 2", {"--pp 2 must divide the ranks (6 / --tp 2)"});
  refused("--world-size 6 --pp 2 --tp 3", {"--tp 3", "attention heads", "(4)"});
  refused(fmt::format("--world-size 8 --pp 2 --tp 2 --offload-optimizer nvme --offload-grads "
                      "nvme --offload-dir '{}'",
                      (dir / "off").string()),
          {"--offload-grads", "not built"});
  // train refuses before the first step, every rank alike.
  EXPECT_NE(run_memfit("train " + args("--steps 2 --pp 2 --tp 2"), 6), 0);
  EXPECT_NE(test::slurp(dir / "err.txt").find("--pp 2 must divide the ranks"), std::string::npos)
      << test::slurp(dir / "err.txt");
}

}  // namespace
}  // namespace memfit
