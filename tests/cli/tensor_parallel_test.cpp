// --tp end to end, through the built binary under mpirun (Note [Tensor parallel],
// docs/notes/tensor-parallel.md): GPT-2 and LLaMA trained over a tensor group of 2 and 4 (LLaMA
// over 4: its 2 key/value heads each replicated on 2 ranks), and 2 x 2 (two data ranks of two
// tensor ranks), give the losses, gradient norms and validation losses of the same run without
// --tp (one process, or the two data ranks alone) within 1e-5 relative: the group's sums add in
// another order than one GEMM, so not bit for bit. With --ckpt full (recomputation re-issues the
// collectives) too. `memfit plan --tp` is every rank's measured peak, by category, and each
// step's tensor-group collectives (bytes and count). What is not built is refused naming the
// option. Skips where memfit was built without MPI.
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

class TensorParallel : public test::MpiBinaryTest {
 protected:
  TensorParallel() : MpiBinaryTest(4242) {}
  std::string args(const std::string& more) const {
    const bool model = more.find("--model") != std::string::npos;
    return fmt::format("{}--n-layer 2 --seq-len 32 --batch 2 --threads 1 --data '{}' {}",
                       model ? "" : "--model gpt2-tiny ", (dir / "data").string(), more);
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
  // The run with --tp against the one without: every step's loss and gradient norm, and the
  // validation losses, within 1e-5 relative.
  // The lines of steps and evaluations (a run over several ranks logs their peaks too).
  static std::vector<json> numbers(const std::vector<json>& log) {
    std::vector<json> out;
    for (const json& j : log)
      if (j.contains("loss") || j.contains("val_loss")) out.push_back(j);
    return out;
  }
  void expect_close(const std::vector<json>& ref_log, const std::vector<json>& tp_log,
                    const std::string& what) const {
    const std::vector<json> ref = numbers(ref_log), tp = numbers(tp_log);
    EXPECT_EQ(ref.size(), tp.size()) << what;
    int compared = 0;
    for (size_t i = 0; i < std::min(ref.size(), tp.size()); ++i)
      for (const char* key : {"loss", "grad_norm", "val_loss"})
        if (ref[i].contains(key)) {
          ASSERT_TRUE(tp[i].contains(key)) << what << ": " << key << " at line " << i;
          const double a = ref[i][key].get<double>(), b = tp[i][key].get<double>();
          EXPECT_LE(std::abs(a - b), 1e-5 * std::abs(a))
              << what << ": " << key << " at line " << i << ": " << b << " against " << a;
          ++compared;
        }
    EXPECT_GE(compared, 8) << what;
  }
};

constexpr const char* kSteps = "--steps 4 --clip 0.05 --eval-every 2 --eval-batches 1";

TEST_F(TensorParallel, Gpt2OverTwoAndFourRanksMatchesOneProcess) {
  const auto ref = train(0, kSteps, "one");
  expect_close(ref, train(2, std::string(kSteps) + " --tp 2", "tp2"), "--tp 2");
  expect_close(ref, train(4, std::string(kSteps) + " --tp 4", "tp4"), "--tp 4");
  const std::string full = std::string(kSteps) + " --ckpt full";
  expect_close(train(0, full, "one-full"), train(2, full + " --tp 2", "tp2-full"),
               "--tp 2 --ckpt full");
}

TEST_F(TensorParallel, LlamaOverTwoAndFourRanksMatchesOneProcess) {
  const std::string a = std::string(kSteps) + " --model llama-tiny --attention plain";
  expect_close(train(0, a, "one"), train(2, a + " --tp 2", "tp2"), "llama --tp 2");
  const std::string full = a + " --ckpt full";
  expect_close(train(0, full, "one-full"), train(2, full + " --tp 2", "tp2-full"),
               "llama --tp 2 --ckpt full");
  // llama-tiny's 2 key/value heads over 4 ranks: each replicated on 2, their gradients summed.
  expect_close(train(0, a, "one"), train(4, a + " --tp 4", "tp4"), "llama --tp 4 (kv replicas)");
}

// Two data ranks of two tensor ranks each: the data-parallel run of two ranks' numbers.
TEST_F(TensorParallel, TwoDataRanksOfTwoTensorRanksMatchDataParallelism) {
  expect_close(train(2, kSteps, "dp2"), train(4, std::string(kSteps) + " --tp 2", "dp2tp2"),
               "2 data x 2 tensor");
}

// Every world rank's measured peak is the plan of its data rank (each tensor rank holds the
// same shapes), by category; each step's tensor collectives are the planned ones (with --ckpt
// full the recomputed blocks' too); and the slices are smaller than the whole model.
TEST_F(TensorParallel, ThePlanIsEveryRanksMeasuredPeak) {
  for (const auto& [ranks, more] : std::vector<std::pair<int, std::string>>{
           {2, "--tp 2"}, {4, "--tp 2"}, {2, "--tp 2 --model llama-tiny --ckpt full"},
           {4, "--tp 4 --model llama-tiny"}}) {
    const std::string a = args("--steps 2 " + more);
    ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size {} --json", a, ranks)), 0)
        << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    const int tp = more.find("--tp 4") != std::string::npos ? 4 : 2;
    ASSERT_EQ(plan["per_rank"].size(), size_t(ranks / tp)) << more;
    // 2 blocks: 4 all-reduces each, the embedding's and d(norm); --ckpt full 4 more.
    EXPECT_EQ(plan["tensor_comm_per_step"]["all_reduce_count"].get<int>(),
              more.find("full") != std::string::npos ? 14 : 10)
        << more;
    const auto log = train(ranks, "--steps 2 " + more, "plan");
    json measured;
    int steps = 0;
    for (const json& j : log) {
      if (j.contains("ranks")) measured = j["ranks"];
      if (!j.contains("loss")) continue;
      ++steps;  // the tensor group's collectives of each step, as planned
      for (const char* k : {"all_reduce", "all_reduce_count", "gathered"})
        EXPECT_EQ(j["tensor_comm_bytes"][k], plan["tensor_comm_per_step"][k]) << k << ", " << more;
    }
    EXPECT_EQ(steps, 2) << more;
    ASSERT_EQ(measured.size(), size_t(ranks)) << "no per-rank peaks in the log";
    for (int q = 0; q < ranks; ++q) {
      const json& p = plan["per_rank"][q / tp];
      EXPECT_EQ(measured[q]["peak_bytes"], p["peak_bytes"]) << more << ", rank " << q;
      for (const char* c :
           {"params", "grads", "optimizer", "activations", "workspace", "comm", "staging"})
        EXPECT_EQ(measured[q]["mem"].value(c, size_t{0}), p["by_category"].value(c, size_t{0}))
            << c << ", " << more << ", rank " << q;
    }
  }
  // The whole model's state against a rank's slice of it.
  ASSERT_EQ(run_memfit(fmt::format("plan {} --json", args("--steps 2"))), 0);
  const size_t whole = json::parse(test::slurp(dir / "out.txt"))["model_state_bytes"];
  ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size 2 --tp 2 --json", args("--steps 2"))), 0);
  const size_t half = json::parse(test::slurp(dir / "out.txt"))["model_state_bytes"];
  EXPECT_LT(half, whole);
  EXPECT_GT(half, whole / 2);  // the norms, positions and row-parallel biases stay whole
}

// bf16, fp16 and the other checkpoint policies are planned (the block code declares their
// buffers), said unbuilt, and refused by train (tests/cli/resolve_train_spec_test.cpp).
TEST_F(TensorParallel, RefusesWhatIsNotBuiltNamingTheOption) {
  auto refused = [&](const std::string& more, const std::string& says) {
    const int code = run_memfit("plan " + args("--steps 2 " + more));
    EXPECT_NE(code, 0) << more;
    const std::string err = test::slurp(dir / "err.txt");
    EXPECT_NE(err.find(says), std::string::npos) << more << ": " << err;
  };
  refused("--world-size 2 --tp 2 --model llama-tiny --n-head 6 --n-kv-head 3", "n_kv_head 3");
  refused("--world-size 3 --tp 3", "--tp 3");                         // 4 heads
  refused("--world-size 3 --tp 2", "must divide the ranks");
  refused("--world-size 2 --tp 2 --zero 1", "--zero");
  refused("--world-size 2 --tp 2 --precision fp8", "--precision");
  refused("--world-size 2 --tp 2 --ckpt auto --mem-limit 1GiB", "--ckpt auto");
  refused(fmt::format("--world-size 2 --tp 2 --save '{}'", (dir / "ck").string()), "--save");
}

}  // namespace
}  // namespace memfit
