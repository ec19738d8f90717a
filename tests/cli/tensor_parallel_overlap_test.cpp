// --tp-overlap end to end under mpirun (Note [Tensor parallel], "Overlap"): the column-parallel
// layers' d(input) sums run on each rank's communication thread while the weight gradients compute,
// which must change nothing but the time. At --tp 2, GPT-2 and LLaMA, with and without --sp, with
// recomputation (--ckpt full, selective), in bf16, fp8 and with LoRA: every loss, gradient norm and
// validation loss, and the saved weights and optimizer state, are the run without it, bit for bit,
// and the log says the sums ran on the thread; so at 2 x 2 ranks with ZeRO 2 and with --pp 2. The
// plan is every rank's measured peak with it on (it lends no buffer of its own), and its step-time
// estimate takes the hidden seconds off the tensor collectives' (and nothing else). What it needs
// is refused naming the option. Skips where memfit was built without MPI.
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

class TensorParallelOverlap : public test::MpiBinaryTest {
 protected:
  TensorParallelOverlap() : MpiBinaryTest(4343) {}
  std::string args(const std::string& more) const {
    const bool model = more.find("--model") != std::string::npos;
    return fmt::format("{}--n-layer 2 --seq-len 32 --batch 2 --threads 1 --data '{}' {}",
                       model ? "" : "--model gpt2-tiny ", (dir / "data").string(), more);
  }
  // `memfit train more` over `ranks` ranks; its log's lines.
  std::vector<json> train(const std::string& more, const std::string& name,
                          int ranks = 2) const {
    const fs::path log = dir / (name + ".jsonl");
    fs::remove(log);
    EXPECT_EQ(
        run_memfit("train " + args(more) + fmt::format(" --log '{}'", log.string()), ranks), 0)
        << more << ": " << test::slurp(dir / "err.txt");
    std::vector<json> out;
    std::istringstream in(test::slurp(log));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  // The run with --tp-overlap on against the run without: the same numbers, bit for bit (the
  // log prints doubles to round trip), the same checkpoint bytes, and the sums on the thread.
  void expect_same(const std::string& more, int ranks = 2) const {
    const auto save = [&](const char* name) {
      return fmt::format(" --save '{}'", (dir / name).string());
    };
    const std::vector<json> off = train(more + save("off"), "off", ranks);
    const std::vector<json> on = train(more + " --tp-overlap on" + save("on"), "on", ranks);
    int compared = 0, overlapped = 0;
    std::vector<json> a, b;
    for (const json& j : off)
      if (j.contains("loss") || j.contains("val_loss")) a.push_back(j);
    for (const json& j : on)
      if (j.contains("loss") || j.contains("val_loss")) b.push_back(j);
    ASSERT_EQ(a.size(), b.size()) << more;
    for (size_t i = 0; i < a.size(); ++i) {
      for (const char* key : {"loss", "grad_norm", "val_loss"})
        if (a[i].contains(key)) {
          ASSERT_TRUE(b[i].contains(key)) << more << ": " << key << " at line " << i;
          EXPECT_EQ(a[i][key].get<double>(), b[i][key].get<double>())
              << more << ": " << key << " at line " << i;
          ++compared;
        }
      if (b[i].contains("loss")) {
        EXPECT_FALSE(a[i].contains("tensor_comm_overlapped_s")) << more;
        ASSERT_TRUE(b[i].contains("tensor_comm_overlapped_s")) << more;
        EXPECT_GT(b[i]["tensor_comm_overlapped_s"].get<double>(), 0.0) << more;
        EXPECT_LE(b[i]["tensor_comm_overlapped_s"].get<double>(),
                  b[i]["tensor_comm_s"].get<double>() + 1e-9)
            << more;
        EXPECT_GE(b[i]["tensor_comm_exposed_s"].get<double>(), 0.0) << more;
        EXPECT_EQ(a[i]["tensor_comm_bytes"], b[i]["tensor_comm_bytes"]) << more;
        ++overlapped;
      }
    }
    EXPECT_GE(compared, 8) << more;
    EXPECT_EQ(overlapped, 4) << more;
    // Every tensor file of the save (weights and optimizer state; LoRA's adapters and theirs).
    int files = 0;
    for (const auto& e : fs::directory_iterator(dir / "off")) {
      if (e.path().extension() != ".safetensors") continue;
      const std::string f = e.path().filename().string();
      const std::string x = test::slurp(dir / "off" / f), y = test::slurp(dir / "on" / f);
      EXPECT_FALSE(x.empty()) << more << ": " << f;
      EXPECT_TRUE(x == y) << more << ": " << f << " differs with --tp-overlap on";
      ++files;
    }
    EXPECT_GE(files, 2) << more;
  }
  json plan(const std::string& more) const {
    EXPECT_EQ(run_memfit(fmt::format("plan {} --world-size 2 --json", args(more))), 0)
        << more << ": " << test::slurp(dir / "err.txt");
    return json::parse(test::slurp(dir / "out.txt"));
  }
};

constexpr const char* kSteps = "--steps 4 --clip 0.05 --eval-every 2 --eval-batches 1 --tp 2";

TEST_F(TensorParallelOverlap, Gpt2IsTheRunWithoutItBitForBit) {
  expect_same(kSteps);
  expect_same(std::string(kSteps) + " --sp --ckpt full");
  expect_same(std::string(kSteps) + " --precision bf16 --ckpt selective --attention plain");
  // fp8: the sum starts after the input's cast, whose scale is a collective of its own.
  expect_same(std::string(kSteps) + " --precision fp8");
}

TEST_F(TensorParallelOverlap, LlamaIsTheRunWithoutItBitForBit) {
  const std::string llama = std::string(kSteps) + " --model llama-tiny";
  expect_same(llama + " --ckpt full");
  expect_same(llama + " --sp");
  expect_same(llama + " --lora-rank 4");
}

// With the data group's own requests in flight during the backward (ZeRO 2 reduces each unit's
// gradients as the backward ends it; the communication thread's MPI calls progress them too)
// and with a pipeline's transfers between the stages: 2 x 2 ranks.
TEST_F(TensorParallelOverlap, ComposesWithZeroAndPipelineBitForBit) {
  expect_same(std::string(kSteps) + " --zero 2", 4);
  expect_same(std::string(kSteps) + " --model llama-tiny --pp 2 --grad-accum 2", 4);
}

// No buffer of its own: every rank's measured peak is still the plan's, by category; the
// estimate takes the hidden seconds off the tensor collectives' and nothing else.
TEST_F(TensorParallelOverlap, PlannedPeakAndHiddenSeconds) {
  for (const std::string more : {"--tp 2", "--tp 2 --sp --model llama-tiny"}) {
    const json p = plan("--steps 2 --tp-overlap on " + more);
    const std::vector<json> log = train("--steps 2 --tp-overlap on " + more, "plan");
    json measured;
    for (const json& j : log)
      if (j.contains("ranks")) measured = j["ranks"];
    ASSERT_EQ(measured.size(), 2u) << more;
    for (int q = 0; q < 2; ++q) {
      EXPECT_EQ(measured[q]["peak_bytes"], p["per_rank"][0]["peak_bytes"]) << more;
      for (const char* c : {"params", "grads", "optimizer", "activations", "workspace", "comm"})
        EXPECT_EQ(measured[q]["mem"].value(c, size_t{0}),
                  p["per_rank"][0]["by_category"].value(c, size_t{0}))
            << c << ", " << more << ", rank " << q;
    }
    const json off = plan("--steps 2 " + more);
    EXPECT_EQ(p["per_rank"][0]["peak_bytes"], off["per_rank"][0]["peak_bytes"]) << more;
    const json &t_on = p["tensor_comm_per_step"], &t_off = off["tensor_comm_per_step"];
    const double hidden = t_on["hidden_seconds"].get<double>();
    EXPECT_GT(hidden, 0.0) << more;
    EXPECT_EQ(t_off["hidden_seconds"].get<double>(), 0.0) << more;
    EXPECT_NEAR(t_on["seconds"].get<double>() + hidden, t_off["seconds"].get<double>(), 1e-12)
        << more;
    EXPECT_NEAR(p["est_step_seconds"].get<double>() + hidden,
                off["est_step_seconds"].get<double>(), 1e-9)
        << more;
  }
}

TEST_F(TensorParallelOverlap, RefusedWithoutTheGroupOrAValue) {
  auto refused = [&](const std::string& more, const std::string& says) {
    for (const char* command : {"plan", "train"}) {
      EXPECT_NE(run_memfit(fmt::format("{} {}", command, args("--steps 1 " + more))), 0) << more;
      const std::string err = test::slurp(dir / "err.txt");
      EXPECT_NE(err.find(says), std::string::npos) << command << " " << more << ": " << err;
    }
  };
  refused("--tp-overlap on", "--tp-overlap on overlaps the tensor group's sums with compute: it "
                             "needs --tp 2 or more (got --tp 1)");
  refused("--tp-overlap maybe", "--tp-overlap must be on or off, got 'maybe'");
}

}  // namespace
}  // namespace memfit
