// Checkpoints across layouts, through the built binary under mpirun (Note [Checkpoints across
// layouts] in docs/notes/checkpoints.md): a save at any tp x dp (x pp) layout resumes at any
// other, and a save and resume with no step between gives the same files, byte for byte
// (model.safetensors and optimizer.safetensors: whole tensors, Hugging Face's names, the
// vocabulary padding of --tp nowhere): GPT-2 tp 2 dp 2 -> tp 1 -> tp 4 -> tp 2; LLaMA with its
// key/value heads replicated (tp 4) -> tp 1 -> tp 2 dp 2 at ZeRO 1; a data-parallel ZeRO 2 save
// into tp 2; pipeline stages, whose save is one process's files bit for bit, pp 2 -> pp 4 -> 1
// and -> tp 2, a tied GPT-2's too (pp 2 -> pp 2 x tp 2; one process -> pp 2). A run resumed at its own layout continues exactly as the run never stopped;
// `memfit export --hf` of a tp save is its model.safetensors; --init-from loads at tp; the plan
// counts the save's staging on every rank (a tied pipeline's too). Skips where memfit was built
// without MPI.
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

class LayoutCheckpoint : public test::MpiBinaryTest {
 protected:
  LayoutCheckpoint() : MpiBinaryTest(4646) {}
  std::string args(const std::string& more) const {
    return fmt::format("--seq-len 32 --batch 2 --threads 1 --clip 0.05 --data '{}' {}",
                       (dir / "data").string(), more);
  }
  std::string path(const char* name) const { return (dir / name).string(); }
  // `memfit train more` under `ranks` ranks (0: one process); its log.
  std::vector<json> train(int ranks, const std::string& more) const {
    const fs::path log = dir / "log.jsonl";
    fs::remove(log);
    EXPECT_EQ(run_memfit("train " + args(more) + fmt::format(" --log '{}'", log.string()), ranks),
              0)
        << more << ": " << test::slurp(dir / "err.txt");
    std::vector<json> out;
    std::istringstream in(test::slurp(log));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  // The steps' lines of a log.
  static std::vector<json> steps(const std::vector<json>& log) {
    std::vector<json> out;
    for (const json& j : log)
      if (j.contains("loss")) out.push_back(j);
    return out;
  }
  // Two checkpoints' weights, optimizer state and config.json: the same bytes.
  void same(const char* x, const char* y) const {
    for (const char* f : {"model.safetensors", "optimizer.safetensors", "config.json"}) {
      const std::string a = test::slurp(dir / x / f), b = test::slurp(dir / y / f);
      EXPECT_FALSE(a.empty()) << x << "/" << f;
      EXPECT_TRUE(a == b) << x << "/" << f << " differs from " << y << "'s";
    }
  }
  // The steps after `from` of a resumed run and of the uninterrupted one: the same losses and
  // gradient norms, bit for bit.
  static void same_steps(const std::vector<json>& whole, const std::vector<json>& resumed,
                         int64_t from, const std::string& what) {
    const std::vector<json> a = steps(whole), b = steps(resumed);
    int compared = 0;
    for (const json& r : b) {
      EXPECT_GT(r["step"].get<int64_t>(), from) << what;
      for (const json& w : a)
        if (w["step"] == r["step"]) {
          EXPECT_EQ(w["loss"].get<double>(), r["loss"].get<double>()) << what << " " << r;
          EXPECT_EQ(w["grad_norm"].get<double>(), r["grad_norm"].get<double>()) << what << " " << r;
          ++compared;
        }
    }
    EXPECT_EQ(compared, 2) << what;
  }
};

// Two steps, then a save (and a resume of it that takes no step: its save is the same state).
constexpr const char* kTwo = "--steps 4 --stop-after 2";
constexpr const char* kGpt2 = "--model gpt2-tiny --n-layer 2 --vocab 520";

TEST_F(LayoutCheckpoint, Gpt2SlicesRoundTripThroughEveryLayout) {
  const std::string two = kTwo;
  train(4, fmt::format("{} {} --tp 2 --save '{}'", kGpt2, two, path("a")));  // tp 2 x dp 2
  train(0, fmt::format("{} --resume '{}' --save '{}'", two, path("a"), path("b")));
  train(4, fmt::format("{} --tp 4 --resume '{}' --save '{}'", two, path("b"), path("c")));
  train(2, fmt::format("{} --tp 2 --resume '{}' --save '{}'", two, path("c"), path("d")));
  same("a", "b");
  same("b", "c");
  same("c", "d");
  // The whole table's 520 rows, not --tp 4's padded 768.
  EXPECT_NE(test::slurp(dir / "a" / "model.safetensors").find("[520,96]"), std::string::npos);
  // export --hf of a tp save: its weights as they are.
  ASSERT_EQ(run_memfit(fmt::format("export --hf '{}' '{}'", path("hf"), path("a"))), 0)
      << test::slurp(dir / "err.txt");
  EXPECT_TRUE(test::slurp(dir / "hf" / "model.safetensors") ==
              test::slurp(dir / "a" / "model.safetensors"));
  // Resumed at its layout, the run continues as if it had not stopped.
  const auto whole = train(4, fmt::format("{} --steps 4 --tp 2", kGpt2));
  same_steps(whole, train(4, fmt::format("--steps 4 --tp 2 --resume '{}'", path("a"))), 2,
             "gpt2 tp 2 x dp 2");
  // --init-from at tp 2 starts from the same weights as one process (the first loss).
  const auto one = steps(train(0, fmt::format("--steps 1 --init-from '{}'", path("b"))));
  const auto tp = steps(train(2, fmt::format("--steps 1 --tp 2 --init-from '{}'", path("b"))));
  ASSERT_EQ(one.size(), 1u);
  ASSERT_EQ(tp.size(), 1u);
  const double a = one[0]["loss"].get<double>(), b = tp[0]["loss"].get<double>();
  EXPECT_LE(std::abs(a - b), 1e-5 * std::abs(a)) << b << " against " << a;
}

TEST_F(LayoutCheckpoint, LlamaReplicatedHeadsAndZeroShardsRoundTrip) {
  const std::string two = kTwo, llama = "--model llama-tiny";
  // llama-tiny's 2 key/value heads over 4 tensor ranks: each replicated, saved once.
  train(4, fmt::format("{} {} --tp 4 --save '{}'", llama, two, path("a")));
  train(0, fmt::format("{} --resume '{}' --save '{}'", two, path("a"), path("b")));
  train(4, fmt::format("{} --tp 2 --zero 1 --resume '{}' --save '{}'", two, path("b"), path("c")));
  train(2, fmt::format("{} --tp 2 --resume '{}' --save '{}'", two, path("c"), path("d")));
  same("a", "b");
  same("b", "c");
  same("c", "d");
  const auto whole = train(4, llama + " --steps 4 --tp 4");
  same_steps(whole, train(4, fmt::format("--steps 4 --tp 4 --resume '{}'", path("a"))), 2,
             "llama tp 4");
  // A data-parallel ZeRO 2 save (shard files) loads into tensor slices.
  train(2, fmt::format("{} {} --zero 2 --save '{}'", llama, two, path("z")));
  EXPECT_TRUE(fs::exists(dir / "z" / "zero_shards.json"));
  train(2, fmt::format("{} --tp 2 --resume '{}' --save '{}'", two, path("z"), path("zt")));
  train(0, fmt::format("{} --resume '{}' --save '{}'", two, path("z"), path("z1")));
  same("zt", "z1");
}

TEST_F(LayoutCheckpoint, PipelineStagesSaveOneProcessesFiles) {
  const std::string two = kTwo, llama = "--model llama-tiny --n-layer 4 --grad-accum 2";
  train(0, fmt::format("{} {} --save '{}'", llama, two, path("one")));
  train(2, fmt::format("{} {} --pp 2 --save '{}'", llama, two, path("p2")));
  same("one", "p2");  // the stages' sums are one process's (Note [Pipeline parallel])
  const std::string on = two + " --grad-accum 2";
  train(4, fmt::format("{} --pp 4 --resume '{}' --save '{}'", on, path("p2"), path("p4")));
  train(0, fmt::format("{} --resume '{}' --save '{}'", on, path("p4"), path("p41")));
  train(2, fmt::format("{} --tp 2 --resume '{}' --save '{}'", on, path("p2"), path("t2")));
  same("p2", "p4");
  same("p4", "p41");
  same("p2", "t2");
  const auto whole = train(2, llama + " --steps 4 --pp 2");
  same_steps(whole,
             train(2, fmt::format("--steps 4 --grad-accum 2 --pp 2 --resume '{}'", path("p2"))), 2,
             "llama pp 2");
}

// A tied head under --pp: the last stage's copy of the token table is the table (Note
// [Pipeline parallel], "Tied embeddings"), written once by the first stage and loaded into both.
TEST_F(LayoutCheckpoint, TiedStagesSaveTheTableOnce) {
  const std::string two = kTwo, gpt2 = "--model gpt2-tiny --vocab 520 --n-layer 4 --grad-accum 2";
  // The tied sum adds the head's and the table's parts in another order than one process
  // (Note [Pipeline parallel], "Tied embeddings"): a pp 2 save is not one process's bits, so
  // each save is resumed at another layout and saved again, with no step between.
  train(0, fmt::format("{} {} --save '{}'", gpt2, two, path("one")));
  train(2, fmt::format("{} {} --pp 2 --save '{}'", gpt2, two, path("p2")));
  const std::string on = two + " --grad-accum 2";
  train(4, fmt::format("{} --pp 2 --tp 2 --resume '{}' --save '{}'", on, path("p2"), path("pt")));
  train(0, fmt::format("{} --resume '{}' --save '{}'", on, path("p2"), path("p1")));
  train(2, fmt::format("{} --pp 2 --resume '{}' --save '{}'", on, path("one"), path("p21")));
  same("p2", "pt");
  same("p2", "p1");
  same("one", "p21");
  const auto whole = train(2, gpt2 + " --steps 4 --pp 2");
  same_steps(whole,
             train(2, fmt::format("--steps 4 --grad-accum 2 --pp 2 --resume '{}'", path("p2"))), 2,
             "gpt2 pp 2 (tied)");
}

// 8-bit, 4-bit and Adam-mini state across layouts (Note [Checkpoints across layouts], "Optimizer
// state of every kind"): at --d-model 512 tp 2's slices are whole 256-value (8-bit) blocks, tp
// 4's whole 128-value (4-bit) blocks. tp 2 x dp 2 -> one process -> tp 4 (8-bit: tp 2, since tp
// 4 is refused before the first step, naming the blocks) -> tp 2 -> pp 2 x tp 2: each save and
// resume with no step between gives the same files; one process resuming a tp save continues as the tp run
// does, within --tp's tolerance (the state it loaded is the tp run's, mapped right).
TEST_F(LayoutCheckpoint, QuantizedAndAdamMiniStateRoundTripsAcrossLayouts) {
  for (const auto& [optim, wide_tp] :
       std::vector<std::pair<std::string, int>>{{"adamw8bit", 2}, {"adamw4bit", 4}, {"adam-mini", 4}}) {
    SCOPED_TRACE(optim);
    const std::string two = std::string(kTwo) + " --optim " + optim;  // a resume names it again
    const std::string model = "--model llama-tiny --d-model 512 --ffn-dim 1024";
    train(4, fmt::format("{} {} --tp 2 --save '{}'", model, two, path("a")));  // tp 2 x dp 2
    train(0, fmt::format("{} --resume '{}' --save '{}'", two, path("a"), path("b")));
    train(4, fmt::format("{} --tp {} --resume '{}' --save '{}'", two, wide_tp, path("b"),
                         path("c")));
    train(2, fmt::format("{} --tp 2 --resume '{}' --save '{}'", two, path("c"), path("d")));
    // Stages of tensor groups: each rank its stage's slices.
    train(4, fmt::format("{} --pp 2 --tp 2 --resume '{}' --save '{}'", two, path("d"), path("f")));
    same("a", "b");
    same("b", "c");
    same("c", "d");
    same("d", "f");
    if (optim == "adamw8bit") {
      // At tp 4 the attention output's 512 columns are runs of 128, half an 8-bit block:
      // refused before the first step, naming the run and what would align it.
      EXPECT_NE(run_memfit("train " + args(fmt::format("{} --tp 4 --resume '{}'", two,
                                                          path("a"))),
                           4),
                0);
      const std::string err = test::slurp(dir / "err.txt");
      EXPECT_NE(err.find("--tp 4"), std::string::npos) << err;
      EXPECT_NE(err.find("quantisation blocks"), std::string::npos) << err;
    }
    // Resumed by one process, a tp 2 run's state steps on as the tp run steps it (one data
    // rank: the same rows).
    train(2, fmt::format("{} {} --tp 2 --save '{}'", model, two, path("e")));
    const auto tp = steps(train(2, fmt::format("{} --steps 4 --tp 2 --optim {}", model, optim)));
    const auto one =
        steps(train(0, fmt::format("--steps 4 --optim {} --resume '{}'", optim, path("e"))));
    int compared = 0;
    for (const json& r : one)
      for (const json& w : tp)
        if (w["step"] == r["step"]) {
          for (const char* k : {"loss", "grad_norm"})
            EXPECT_LE(std::abs(w[k].get<double>() - r[k].get<double>()),
                      1e-5 * std::abs(w[k].get<double>()))
                << k << " " << r << " against " << w;
          ++compared;
        }
    EXPECT_EQ(compared, 2);
  }
}

// Offloaded, 4-bit AdamW's and Adam-mini's state is written and read through the same state
// runs as from RAM (each piece's runs cut to its state elements: the 4-bit rank-1 maxima, the
// shared row-parallel v): at tp 2 the offloaded save is the in-RAM save's bytes, and an
// offloaded resume of it saves them again.
TEST_F(LayoutCheckpoint, OffloadedBlockWiseStateSavesAndResumesAsInRam) {
  const std::string off = fmt::format(" --offload-optimizer nvme --offload-dir '{}'", path("off"));
  for (const char* optim : {"adamw4bit", "adam-mini"}) {
    SCOPED_TRACE(optim);
    const std::string two = fmt::format("{} --optim {} --tp 2", kTwo, optim);
    const std::string model = "--model llama-tiny --d-model 512 --ffn-dim 1024";
    train(2, fmt::format("{} {} --save '{}'", model, two, path("r")));
    train(2, fmt::format("{} {} --save '{}'", model, two, path("o")) + off);
    same("r", "o");
    train(2, fmt::format("{} --resume '{}' --save '{}'", two, path("r"), path("o2")) + off);
    same("r", "o2");
    fs::remove_all(path("r"));
    fs::remove_all(path("o"));
    fs::remove_all(path("o2"));
  }
  EXPECT_TRUE(!fs::exists(dir / "off") || fs::is_empty(dir / "off")) << "files left behind";
}

// Every optimizer under --pp saves one process's files (each stage's state is its run of the
// whole model's), and a pp 2 save resumes in one process and saves the same files again.
TEST_F(LayoutCheckpoint, PipelineStagesSaveEveryOptimizersState) {
  for (const char* optim : {"adamw8bit", "adamw4bit", "adam-mini", "apollo", "galore8bit"}) {
    SCOPED_TRACE(optim);
    const std::string two = fmt::format("{} --optim {}", kTwo, optim);
    const std::string llama = "--model llama-tiny --n-layer 4 --grad-accum 2";
    train(0, fmt::format("{} {} --save '{}'", llama, two, path("one")));
    train(2, fmt::format("{} {} --pp 2 --save '{}'", llama, two, path("p2")));
    same("one", "p2");
    train(0, fmt::format("{} --grad-accum 2 --resume '{}' --save '{}'", two, path("p2"),
                         path("p1")));
    same("p2", "p1");
  }
}

// A tp run that saves: every rank's planned peak is its measured one, by category (the save's
// transposes stage through Category::staging on every rank).
TEST_F(LayoutCheckpoint, ThePlanCountsTheSaveOnEveryRank) {
  const std::string a = fmt::format("{} --steps 2 --tp 2 --save '{}'", kGpt2, path("ck"));
  ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size 4 --json", args(a))), 0)
      << test::slurp(dir / "err.txt");
  const json plan = json::parse(test::slurp(dir / "out.txt"));
  json measured;
  for (const json& j : train(4, a))
    if (j.contains("ranks")) measured = j["ranks"];
  ASSERT_EQ(measured.size(), 4u);
  EXPECT_GT(plan["per_rank"][0]["by_category"].value("staging", size_t{0}), size_t{0});
  for (int q = 0; q < 4; ++q) {
    const json& p = plan["per_rank"][q / 2];
    EXPECT_EQ(measured[q]["peak_bytes"], p["peak_bytes"]) << "rank " << q;
    for (const char* c : {"params", "grads", "optimizer", "activations", "workspace", "staging"})
      EXPECT_EQ(measured[q]["mem"].value(c, size_t{0}), p["by_category"].value(c, size_t{0}))
          << c << ", rank " << q;
  }
  // A tied GPT-2's stages (the last one's copy of the table is not written): one a rank.
  const std::string b = fmt::format("--model gpt2-tiny --vocab 520 --n-layer 4 --grad-accum 2 "
                                    "--steps 2 --pp 2 --save '{}'",
                                    path("ckp"));
  ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size 2 --json", args(b))), 0)
      << test::slurp(dir / "err.txt");
  const json pplan = json::parse(test::slurp(dir / "out.txt"));
  measured = json{};
  for (const json& j : train(2, b))
    if (j.contains("ranks")) measured = j["ranks"];
  ASSERT_EQ(measured.size(), 2u);
  for (int q = 0; q < 2; ++q)
    EXPECT_EQ(measured[q]["peak_bytes"], pplan["per_rank"][q]["peak_bytes"]) << "stage " << q;
}

// --offload-optimizer under --tp and dp x tp: each rank's part of the save streamed out of its
// files (the master weights' and the state's pieces through the ring) is the in-RAM run's
// save, byte for byte (bf16 with master weights at 2 data x 2 tensor ranks under ZeRO 2; fp32
// under ZeRO 3, the working shard the weights of record, in RAM or with --offload-params in
// each rank's file); it resumes offloaded at any
// layout (tp 2 x dp 2 -> one process -> tp 4) to the same files, and at its own layout
// continues as the run in RAM, bit for bit; every rank's planned peak by category (the ring and
// the save's staging) is its measured one.
TEST_F(LayoutCheckpoint, OffloadedOptimizerSavesAndResumesTheRunInRam) {
  const std::string two = kTwo;
  const std::string off = fmt::format(" --offload-optimizer nvme --offload-dir '{}'", path("off"));
  const std::string bf16 = std::string(kGpt2) + " --precision bf16 --tp 2 --zero 2";
  train(4, fmt::format("{} {} --save '{}'", bf16, two, path("ram")));
  const auto saved = train(4, fmt::format("{} {} --save '{}'", bf16, two, path("a")) + off);
  same("ram", "a");
  train(0, fmt::format("{} --precision bf16 --resume '{}' --save '{}'", two, path("a"), path("b")) +
               off);
  train(4, fmt::format("{} --precision bf16 --tp 4 --resume '{}' --save '{}'", two, path("b"),
                       path("c")) +
               off);
  same("a", "b");
  same("b", "c");
  const std::string fp32 = std::string(kGpt2) + " --tp 2 --zero 3";
  train(4, fmt::format("{} {} --save '{}'", fp32, two, path("ram32")));
  train(4, fmt::format("{} {} --save '{}'", fp32, two, path("a32")) + off);
  same("ram32", "a32");
  // --offload-params too: the working weights of record streamed from each rank's file.
  train(4, fmt::format("{} {} --save '{}'", fp32, two, path("p32")) + off +
               " --offload-params nvme");
  same("ram32", "p32");
  // Resumed offloaded at its own layout: the run in RAM that never stopped.
  const std::string on = "--steps 4 --precision bf16 --tp 2 --zero 2";
  const auto whole = train(4, std::string(kGpt2) + " " + on);
  same_steps(whole, train(4, fmt::format("{} --resume '{}'", on, path("a")) + off), 2,
             "bf16 tp 2 x dp 2, offloaded");
  same_steps(whole, train(4, fmt::format("{} --resume '{}'", on, path("ram")) + off), 2,
             "bf16 tp 2 x dp 2, a RAM save resumed offloaded");
  // The plan of the saving run: every rank's peak by category.
  ASSERT_EQ(run_memfit(fmt::format("plan {} --world-size 4 --json",
                                   args(fmt::format("{} {} --save '{}'", bf16, two, path("a")) +
                                        off))),
            0)
      << test::slurp(dir / "err.txt");
  const json plan = json::parse(test::slurp(dir / "out.txt"));
  json measured;
  for (const json& j : saved)
    if (j.contains("ranks")) measured = j["ranks"];
  ASSERT_EQ(measured.size(), 4u);
  for (int q = 0; q < 4; ++q) {
    const json& p = plan["per_rank"][q / 2];
    EXPECT_EQ(measured[q]["peak_bytes"], p["peak_bytes"]) << "rank " << q;
    for (const char* c : {"params", "grads", "optimizer", "master", "staging"})
      EXPECT_EQ(measured[q]["mem"].value(c, size_t{0}), p["by_category"].value(c, size_t{0}))
          << c << ", rank " << q;
    EXPECT_EQ(measured[q]["offload"]["disk"], p["offload"]["disk_by_category"]) << "rank " << q;
  }
  EXPECT_TRUE(!fs::exists(dir / "off") || fs::is_empty(dir / "off")) << "files left behind";
}

}  // namespace
}  // namespace memfit
