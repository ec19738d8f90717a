// ZeRO stages end to end, through the built binary under `mpirun -n 2`: stages 0, 1, 2 and 3 at
// the same world size train to the same losses, gradient norms and (FP32) saved weights bit for bit,
// in fp32 (with clipping active and gradient accumulation), bf16 with sharded master weights and
// fp16 with its loss scaler; stage 3 at every prefetch depth and persistence; and `memfit plan
// --world-size 2 --zero K` is every rank's measured peak by category. Skips where memfit was
// built without MPI. Note [ZeRO] (docs/notes/zero.md).
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <map>
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

class Zero : public test::MpiBinaryTest {
 protected:
  Zero() : MpiBinaryTest(1414) {}
  // Runs `memfit args`, alone (ranks 0) or under mpirun; returns the exit code.
  int run(int ranks, const std::string& args) const {
    return run_memfit(args, ranks);
  }
  std::string args(const std::string& more) const {
    const bool batch = more.find("--batch") != std::string::npos;
    const bool model = more.find("--model") != std::string::npos;
    return fmt::format("{}--n-layer 2 --seq-len 32 {}--threads 1 --data '{}' {}",
                       model ? "" : "--model gpt2-tiny ", batch ? "" : "--batch 2 ",
                       (dir / "data").string(), more);
  }
  // A checkpoint's weights as a Hugging Face model.safetensors: `memfit export --hf`, which
  // reads model.safetensors or, in a sharded save (no model.safetensors), the shard files.
  std::string exported_weights(const fs::path& ck) const {
    const fs::path out = dir / ("hf-of-" + ck.filename().string());
    fs::remove_all(out);
    EXPECT_EQ(run(0, fmt::format("export --hf '{}' '{}'", out.string(), ck.string())), 0)
        << test::slurp(dir / "err.txt");
    return test::slurp(out / "model.safetensors");
  }
  std::vector<json> lines(const fs::path& log) const {
    std::vector<json> out;
    std::istringstream in(test::slurp(log));
    for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
    return out;
  }
  // Trains at each stage with `more`, and expects every stage's log (loss, gradient norm, loss
  // scale, validation) equal to stage 0's; returns the logs.
  std::vector<std::vector<json>> stages_agree(const std::string& more, bool save, int ranks = 2) {
    std::vector<std::vector<json>> logs;
    std::string weights0;
    for (int zero = 0; zero <= 3; ++zero) {
      const fs::path log = dir / fmt::format("z{}.jsonl", zero), ck = dir / fmt::format("ck{}", zero);
      std::string a = args(more) + fmt::format(" --zero {} --log '{}'", zero, log.string());
      if (save) a += fmt::format(" --save '{}'", ck.string());
      EXPECT_EQ(run(ranks, "train " + a), 0) << test::slurp(dir / "err.txt");
      logs.push_back(lines(log));
      if (save) {
        // From stage 1 on over several ranks each rank wrote its own range: no gathered
        // model.safetensors, and the shard files export to stage 0's weights bit for bit.
        EXPECT_EQ(fs::exists(ck / "model.safetensors"), zero == 0 || ranks == 1) << zero;
        const std::string w = exported_weights(ck);
        EXPECT_FALSE(w.empty());
        if (zero == 0)
          weights0 = w;
        else
          EXPECT_TRUE(w == weights0) << "stage " << zero << "'s saved weights differ from stage 0's";
      }
    }
    int compared = 0;
    for (int zero = 1; zero <= 3; ++zero) {
      EXPECT_EQ(logs[zero].size(), logs[0].size());
      for (size_t i = 0; i < std::min(logs[0].size(), logs[zero].size()); ++i)
        for (const char* key : {"loss", "grad_norm", "loss_scale", "skipped", "val_loss"})
          if (logs[0][i].contains(key)) {
            EXPECT_EQ(logs[0][i][key], logs[zero][i][key])
                << key << " at line " << i << ", stage " << zero;
            ++compared;
          }
    }
    EXPECT_GE(compared, 8);
    return logs;
  }
  // The plan of each rank, at each stage, is that rank's measured peak, byte for byte (under
  // `mpirun -n ranks`), and the model state shrinks from stage 0 to 1 (sharded optimizer state).
  void expect_resume_is_bit_identical(int zero);
  // `reductions`: the gradient exchanges a step (the micro-batches, where each is reduced).
  // `fp8_codes`: stages 1-2 gather the stored FP8 weights' codes (one byte a linear weight,
  // dist/zero/fp8_publish.h), below the bf16 working weights' one Ψ.
  void expect_plan_per_rank(int ranks, const std::string& more, size_t state[4],
                            int reductions = 1, bool fp8_codes = false) {
    for (int zero = 0; zero <= 3; ++zero) {
      const std::string a = args(fmt::format("--steps 2 --bucket-mb 0.25 {} --zero {}", more, zero));
      ASSERT_EQ(run(0, fmt::format("plan {} --world-size {} --json", a, ranks)), 0)
          << test::slurp(dir / "err.txt");
      const json plan = json::parse(test::slurp(dir / "out.txt"));
      ASSERT_EQ(plan["per_rank"].size(), size_t(ranks));
      state[zero] = plan["model_state_bytes"];
      const fs::path log = dir / fmt::format("p{}.jsonl", zero);
      ASSERT_EQ(run(ranks, "train " + a + fmt::format(" --log '{}'", log.string())), 0)
          << test::slurp(dir / "err.txt");
      json measured;
      int steps = 0;
      for (const json& j : lines(log)) {
        if (j.contains("ranks")) measured = j["ranks"];
        if (!j.contains("loss")) continue;
        ++steps;  // each step's collectives covered the bytes the plan says
        for (const char* c : {"all_reduce", "reduce_scatter", "all_gather"})
          EXPECT_EQ(j["comm_bytes"][c], plan["comm_per_step"][c]) << c << ", stage " << zero;
      }
      EXPECT_EQ(steps, 2);
      const double psi = plan["comm_per_step"]["psi_multiple"].get<double>();
      if (zero < 3) {
        // An all-reduce sends the gradients twice, a reduce-scatter once; stages 1-2 all-gather
        // the working weights once.
        const double want = zero == 2 ? reductions + 1.0 : 2.0 * reductions + zero;
        if (fp8_codes && zero > 0) {  // the linears at one byte: between half a Ψ and one
          EXPECT_LT(psi, want);
          EXPECT_GT(psi, want - 0.5);
        } else {
          EXPECT_EQ(psi, want);
        }
      } else {
        // Stage 3: the gradients reduce-scattered (1), the persistent units once and the
        // blocks gathered for the forward and again for the backward but the top one: the
        // paper's 3 less the embeddings' and the top block's second gather.
        EXPECT_GT(psi, 2.0 * reductions);
        EXPECT_LT(psi, 3.0 * reductions + 1);
      }
      ASSERT_EQ(measured.size(), size_t(ranks)) << "no per-rank peaks in the log";
      for (int r = 0; r < ranks; ++r) {
        const json& p = plan["per_rank"][r];
        EXPECT_EQ(measured[r]["peak_bytes"], p["peak_bytes"]) << "stage " << zero << " rank " << r;
        for (const char* c : {"params", "master", "grads", "optimizer", "comm"})
          EXPECT_EQ(measured[r]["mem"].value(c, size_t{0}), p["by_category"].value(c, size_t{0}))
              << c << ", stage " << zero << " rank " << r;
      }
    }
  }
};

// FP32, clipping on at every step (--clip 0.05 is below every norm here), two micro-batches a
// step: losses, norms and the saved weights equal bit for bit at stages 0, 1 and 2.
TEST_F(Zero, StagesAreBitIdenticalInFp32) {
  const auto logs = stages_agree(
      "--steps 5 --grad-accum 2 --sync-every-micro-batch --clip 0.05 --eval-batches 2", true);
  for (const json& j : logs[0])
    if (j.contains("grad_norm")) { EXPECT_GT(j["grad_norm"].get<double>(), 0.05); }  // clipped
}

// bf16 with FP32 master weights (sharded from stage 1 on, gathered for the save) and Adam-mini,
// whose cuts fall on its blocks: the same losses, norms and saved master weights at every stage.
TEST_F(Zero, StagesAreBitIdenticalInBf16WithShardedMasterWeights) {
  stages_agree("--steps 4 --precision bf16 --optim adam-mini --eval-batches 2 --save-every 2",
               true);
}

// APOLLO-Mini, whose per-matrix state cuts the shards at matrix edges, with a new projection
// every 2 steps: the same losses, norms and saved weights at every stage.
TEST_F(Zero, StagesAreBitIdenticalWithApolloMini) {
  stages_agree("--steps 3 --optim apollo-mini --optim-proj-gap 2 --eval-batches 1", true);
}

// GaLore-8bit, whose projected moments and projector cut the shards at matrix edges, with a new
// projector (an SVD) at step 3: the same losses, norms and saved weights at every stage.
TEST_F(Zero, StagesAreBitIdenticalWithGalore8bit) {
  stages_agree("--steps 3 --optim galore8bit --optim-rank 8 --optim-proj-gap 2 --eval-batches 1",
               true);
}

// Pure bf16 (no master weights: the weights of record are the working weights, at stage 3 a
// shard, gathered as bf16 for the save): every stage the same losses and saved BF16 weights.
TEST_F(Zero, StagesAreBitIdenticalInPureBf16) {
  stages_agree("--steps 3 --precision bf16 --master-weights none --eval-batches 1", true);
}

// --init-from into sharded master weights (through the gradient slab): every stage starts from
// the checkpoint's weights and trains to the same losses.
TEST_F(Zero, InitFromLoadsShardedMasterWeights) {
  const fs::path ck = dir / "init";
  ASSERT_EQ(run(0, "train " + args(fmt::format("--steps 3 --save '{}'", ck.string()))), 0)
      << test::slurp(dir / "err.txt");
  const auto logs = stages_agree(
      fmt::format("--steps 2 --precision bf16 --eval-batches 1 --init-from '{}'", ck.string()),
      false);
  // Not a fresh start: the first loss is below an initialised model's (ln 512 = 6.24).
  ASSERT_FALSE(logs[1].empty());
  EXPECT_LT(logs[1][0]["loss"].get<double>(), 6.2);
}

// fp16: the overflow decision is every rank's, from the same sums (stage 2: the shards' flags
// gathered), so the scale and the skipped steps agree; a large initial scale makes the first
// steps overflow and skip, then it trains.
TEST_F(Zero, StagesAgreeOnFp16Overflows) {
  const auto logs =
      stages_agree("--steps 8 --precision fp16 --attention plain --optim adamw8bit "
                   "--initial-loss-scale 16777216 "
                   "--eval-batches 2",
                   false);
  int skipped = 0, updated = 0;
  for (const json& j : logs[0])
    if (j.contains("skipped")) (j["skipped"].get<bool>() ? skipped : updated) += 1;
  EXPECT_GT(skipped, 0);
  EXPECT_GT(updated, 0);
}

// LLaMA (untied head; the fused q|k|v and gate|up groups cut across ranks), bf16 with master
// weights and clipping: every stage the same bits.
TEST_F(Zero, StagesAreBitIdenticalForLlama) {
  stages_agree("--model llama-tiny --steps 4 --precision bf16 --clip 0.05 --eval-batches 1",
               false);
}

// --precision fp8 (Note [FP8]): stages 0-2 store the linears as E4M3 codes (at stages 1-2 each
// rank encodes its shard of the master weights with the scales the ranks agree on, and the
// codes are all-gathered: dist/zero/fp8_publish.h), stage 3 keeps bf16 working weights whose
// cast gives the codes' values ("Storage"), so every stage gives the same bits; the start-up
// line says which storage each got and why; each rank's plan, with the codes and their
// gather, is its measured peak and its collectives' bytes.
TEST_F(Zero, StagesAreBitIdenticalInFp8AndPlannedPerRank) {
  stages_agree("--model llama-tiny --steps 3 --precision fp8 --clip 0.05 --eval-batches 1", true);
  for (int zero = 0; zero <= 3; ++zero) {
    ASSERT_EQ(run(2, "train " + args(fmt::format("--model llama-tiny --steps 1 --precision fp8 "
                                                 "--zero {}",
                                                 zero))),
              0)
        << test::slurp(dir / "err.txt");
    const std::string err = test::slurp(dir / "err.txt");
    if (zero < 3) {
      EXPECT_NE(err.find("stored as E4M3 codes, one byte each"), std::string::npos) << err;
      EXPECT_EQ(err.find("and the codes are all-gathered") != std::string::npos, zero > 0)
          << err;
    } else {
      EXPECT_NE(err.find("stored as bf16 and cast to E4M3 at each use (the same values as the "
                         "stored codes): ZeRO stage 3 shards and gathers"),
                std::string::npos)
          << err;
    }
  }
  size_t state[4] = {};
  expect_plan_per_rank(2, "--precision fp8", state, 1, /*fp8_codes=*/true);
  EXPECT_LT(state[1], state[0]);  // the master weights and the optimizer state sharded
}

// Four ranks (uneven shards, 8-bit blocks): stages 0-3 give the same bits.
TEST_F(Zero, FourRanksStagesAreBitIdentical) {
  stages_agree("--steps 3 --batch 1 --optim adamw8bit --clip 0.05 --eval-batches 1", true, 4);
}

TEST_F(Zero, ThePlanPerRankIsEachRanksMeasuredPeak) {
  size_t state[4] = {};
  expect_plan_per_rank(2, "--precision bf16", state);
  EXPECT_LT(state[1], state[0]);
  EXPECT_LT(state[2], state[1]);  // the gradients sharded (Note [Sharded gradients])
  EXPECT_LT(state[3], state[2]);  // the working weights sharded
}

// Every micro-batch reduced (stages 2-3 always, stages 0-1 with --sync-every-micro-batch): the
// plan's collectives are the micro-batches' and its buffers each rank's, as measured.
TEST_F(Zero, ThePlanPerRankCountsEveryMicroBatchsReduction) {
  size_t state[4] = {};
  expect_plan_per_rank(2, "--grad-accum 2 --sync-every-micro-batch --ckpt every:2", state, 2);
  EXPECT_LT(state[1], state[0]);
}

// LLaMA's untied head: the embeddings' gradients share the tail's buffer (UnitGrads), in f32
// and bf16, each micro-batch reduced: every rank's plan is its measured peak, and the stages
// train to the same bits with bf16 gradients and accumulation.
TEST_F(Zero, ThePlanPerRankIsEachRanksMeasuredPeakForLlama) {
  size_t state[4] = {};
  expect_plan_per_rank(2, "--model llama-tiny --grad-accum 2 --sync-every-micro-batch", state, 2);
  EXPECT_LT(state[3], state[2]);
  expect_plan_per_rank(
      2, "--model llama-tiny --precision bf16 --grad-dtype bf16 --grad-accum 2 "
         "--sync-every-micro-batch", state, 2);
  EXPECT_LT(state[3], state[2]);
  stages_agree("--model llama-tiny --steps 3 --grad-accum 2 --sync-every-micro-batch --clip 0.05 "
               "--grad-dtype bf16", false);
}

TEST_F(Zero, ThePlanPerRankIsEachRanksMeasuredPeakOverFourRanks) {
  size_t state[4] = {};
  expect_plan_per_rank(4, "--batch 1 --optim adam-mini --precision bf16", state);
  EXPECT_LT(state[1], state[0]);
  EXPECT_LT(state[2], state[1]);
  EXPECT_LT(state[3], state[2]);
}

TEST_F(Zero, ThePlanPerRankIsEachRanksMeasuredPeakWithApollo) {
  size_t state[4] = {};
  expect_plan_per_rank(2, "--batch 1 --optim apollo --optim-rank 8 --precision bf16", state);
  EXPECT_LT(state[1], state[0]);
}

TEST_F(Zero, ThePlanPerRankIsEachRanksMeasuredPeakWithGalore) {
  size_t state[4] = {};
  expect_plan_per_rank(2, "--batch 1 --optim galore --optim-rank 8 --precision bf16", state);
  EXPECT_LT(state[1], state[0]);
}

// Stage 2 keeps working with one process (equal to stage 0); --zero 4 is refused.
TEST_F(Zero, OneRankIsStageZero) {
  const fs::path a = dir / "a.jsonl", b = dir / "b.jsonl";
  ASSERT_EQ(run(0, "train " + args("--steps 3 --zero 0 --log '" + a.string() + "'")), 0)
      << test::slurp(dir / "err.txt");
  ASSERT_EQ(run(0, "train " + args("--steps 3 --zero 2 --log '" + b.string() + "'")), 0)
      << test::slurp(dir / "err.txt");
  const auto la = lines(a), lb = lines(b);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i) EXPECT_EQ(la[i].value("loss", 0.0), lb[i].value("loss", 0.0));
  EXPECT_EQ(run(0, "train " + args("--steps 1 --zero 4")), 2);
  EXPECT_NE(test::slurp(dir / "err.txt").find("--zero must be 0, 1, 2, 3 or auto"),
            std::string::npos);
}

// --zero auto under a per-rank --mem-limit that stage 0 does not fit: the planner picks a
// higher stage, `memfit plan` and both ranks of `mpirun -n 2 memfit train` agree on it, and the
// run trains at it within every rank's budget (the pool's limit is the per-rank budget).
TEST_F(Zero, AutoPicksAStageThatFitsEveryRankAndTrainsAtIt) {
  const std::string base = args("--steps 2 --precision bf16 --ckpt none --bucket-mb 0.25");
  size_t peak0 = 0;
  {
    ASSERT_EQ(run(0, fmt::format("plan {} --world-size 2 --zero 0 --json", base)), 0)
        << test::slurp(dir / "err.txt");
    const json plan0 = json::parse(test::slurp(dir / "out.txt"));
    ASSERT_EQ(plan0["per_rank"].size(), 2u);
    for (const json& r : plan0["per_rank"]) peak0 = std::max(peak0, r["peak_bytes"].get<size_t>());
  }
  const size_t limit = peak0 - 1;  // stage 0 does not fit on some rank
  ASSERT_EQ(run(0, fmt::format("plan {} --world-size 2 --zero auto --mem-limit {} --json", base,
                               limit)),
            0)
      << test::slurp(dir / "err.txt");
  const json plan = json::parse(test::slurp(dir / "out.txt"));
  ASSERT_TRUE(plan["search"]["fits"].get<bool>()) << plan["search"].dump();
  const int stage = plan["search"]["choice"]["zero"];
  EXPECT_GE(stage, 1);
  for (const json& r : plan["per_rank"]) EXPECT_LE(r["peak_bytes"].get<size_t>(), limit);
  const fs::path log = dir / "auto.jsonl";
  ASSERT_EQ(run(2, fmt::format("train {} --zero auto --mem-limit {} --log '{}'", base, limit,
                               log.string())),
            0)
      << test::slurp(dir / "err.txt");
  const std::vector<json> l = lines(log);
  int steps = 0, summaries = 0;
  for (const json& j : l) {
    if (j.contains("loss")) ++steps;
    if (!j.contains("ranks")) continue;  // the run's last line: the stage and every rank's peak
    ++summaries;
    EXPECT_EQ(j["zero"], stage) << j.dump();
    for (const json& r : j["ranks"]) EXPECT_LE(r["peak_bytes"].get<size_t>(), limit);
  }
  EXPECT_EQ(steps, 2);
  EXPECT_EQ(summaries, 1);
}

// Stage 3's prefetch depth and persistence move the same bytes at other times: depths 0, 1 and
// 2 and every block kept whole give stage 2's losses, norms and saved weights bit for bit, with
// checkpointing (a segment of two blocks: each recomputed, then gathered again for its
// backward); each run's gathers and buffers are what its plan says.
TEST_F(Zero, PrefetchDepthAndPersistenceChangeNoBit) {
  const std::string common =
      "--steps 3 --grad-accum 2 --ckpt every:2 --clip 0.05 --eval-batches 1 --bucket-mb 0.25";
  auto train = [&](const std::string& name, const std::string& more) {
    const fs::path log = dir / (name + ".jsonl"), ck = dir / name;
    const std::string a = args(common + " " + more);
    EXPECT_EQ(run(2, fmt::format("train {} --log '{}' --save '{}'", a, log.string(), ck.string())),
              0)
        << more << ": " << test::slurp(dir / "err.txt");
    EXPECT_EQ(run(0, fmt::format("plan {} --world-size 2 --json", a)), 0)
        << test::slurp(dir / "err.txt");
    const json plan = json::parse(test::slurp(dir / "out.txt"));
    std::vector<json> steps;
    for (const json& j : lines(log)) {
      if (j.contains("loss")) {
        steps.push_back(j);
        if (more.find("--zero 3") != std::string::npos) {
          EXPECT_EQ(j["comm_bytes"]["all_gather"], plan["comm_per_step"]["all_gather"]) << more;
        }
      }
      if (j.contains("ranks")) {
        for (int r = 0; r < 2; ++r)
          EXPECT_EQ(j["ranks"][r]["mem"].value("comm", size_t{0}),
                    plan["per_rank"][r]["by_category"].value("comm", size_t{0}))
              << more << ", rank " << r;
      }
    }
    EXPECT_EQ(steps.size(), 3u) << more;
    return std::make_pair(steps, exported_weights(ck));
  };
  const auto [want, weights] = train("z2", "--zero 2");
  ASSERT_FALSE(weights.empty());
  size_t comm_depth0 = 0;
  for (const char* more : {"--zero 3 --prefetch-depth 0", "--zero 3", "--zero 3 --prefetch-depth 2",
                           "--zero 3 --persist-threshold 100000000"}) {
    const auto [got, w] = train(fmt::format("v{}", comm_depth0++), more);
    ASSERT_EQ(got.size(), want.size()) << more;
    for (size_t i = 0; i < want.size(); ++i)
      for (const char* key : {"loss", "grad_norm"})
        EXPECT_EQ(want[i][key], got[i][key]) << key << " at step " << i + 1 << ", " << more;
    EXPECT_TRUE(w == weights) << more << ": the saved weights differ from stage 2's";
  }
}

// Stage 3's options: bad values are refused naming the option; with one rank --zero 3 is
// stage 0.
TEST_F(Zero, StageThreeOptionsAreChecked) {
  EXPECT_EQ(run(0, "train " + args("--steps 1 --zero 3 --prefetch-depth -1")), 2);
  EXPECT_NE(test::slurp(dir / "err.txt").find("prefetch-depth"), std::string::npos)
      << test::slurp(dir / "err.txt");
  EXPECT_EQ(run(0, "plan " + args("--steps 1 --zero 3 --world-size 2 --persist-threshold -5")), 2);
  EXPECT_NE(test::slurp(dir / "err.txt").find("persist-threshold"), std::string::npos)
      << test::slurp(dir / "err.txt");
  const fs::path a = dir / "a.jsonl", b = dir / "b.jsonl";
  ASSERT_EQ(run(0, "train " + args("--steps 2 --zero 0 --log '" + a.string() + "'")), 0)
      << test::slurp(dir / "err.txt");
  ASSERT_EQ(run(0, "train " + args("--steps 2 --zero 3 --log '" + b.string() + "'")), 0)
      << test::slurp(dir / "err.txt");
  const auto la = lines(a), lb = lines(b);
  ASSERT_EQ(la.size(), lb.size());
  for (size_t i = 0; i < la.size(); ++i)
    EXPECT_EQ(la[i].value("loss", 0.0), lb[i].value("loss", 0.0));
}

// Every file of a checkpoint directory, by name.
std::map<std::string, std::string> files_of(const fs::path& ck) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(ck)) out[e.path().filename()] = test::slurp(e.path());
  return out;
}

// A sharded save (stage 2, bf16 master weights) stopped after 2 of 4 steps and resumed at the
// same world size and stage ends with the uninterrupted run's losses and every saved file bit
// for bit: the shard files, their index, the gathered weights and the trainer's state.
// Stage 3 too (its working weights a shard, rebuilt from the loaded master weights).
TEST_F(Zero, ShardedResumeIsBitIdentical) {
  for (int zero : {2, 3}) {
    SCOPED_TRACE(fmt::format("stage {}", zero));
    expect_resume_is_bit_identical(zero);
  }
}

void Zero::expect_resume_is_bit_identical(int zero) {
  const std::string common =
      fmt::format("--steps 4 --precision bf16 --zero {} --eval-batches 1", zero);
  const fs::path full = dir / fmt::format("full{}", zero), part = dir / fmt::format("part{}", zero);
  const fs::path full_log = dir / fmt::format("full{}.jsonl", zero),
                 part_log = dir / fmt::format("part{}.jsonl", zero);
  ASSERT_EQ(run(2, "train " + args(fmt::format("{} --save '{}' --log '{}'", common, full.string(),
                                               full_log.string()))),
            0)
      << test::slurp(dir / "err.txt");
  ASSERT_EQ(run(2, "train " + args(fmt::format("{} --stop-after 2 --save '{}' --log '{}'", common,
                                               part.string(), part_log.string()))),
            0)
      << test::slurp(dir / "err.txt");
  EXPECT_TRUE(fs::exists(part / "zero_shards.json"));
  EXPECT_TRUE(fs::exists(part / "zero-rank-00001-of-00002.safetensors"));
  EXPECT_FALSE(fs::exists(part / "optimizer.safetensors"));
  EXPECT_FALSE(fs::exists(dir / fmt::format("part{}.zero-staging", zero)));
  ASSERT_EQ(run(2, "train " + args(fmt::format("{} --resume '{}' --save '{}' --log '{}'", common,
                                               part.string(), part.string(), part_log.string()))),
            0)
      << test::slurp(dir / "err.txt");
  std::vector<json> a, b;
  for (const json& j : lines(full_log))
    if (j.contains("loss")) a.push_back(j);
  for (const json& j : lines(part_log))
    if (j.contains("loss")) b.push_back(j);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i)
    for (const char* key : {"step", "loss", "grad_norm"})
      EXPECT_EQ(a[i][key], b[i][key]) << key << " " << i;
  const auto want = files_of(full), got = files_of(part);
  EXPECT_FALSE(got.count("model.safetensors")) << "a sharded save gathers no weights";
  ASSERT_EQ(want.size(), got.size());
  for (const auto& [name, bytes] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    EXPECT_TRUE(got.at(name) == bytes) << name << " differs from the uninterrupted run's";
  }
  // The shard files alone are the checkpoint's weights too: without model.safetensors, export
  // assembles them from the shards' ranges (make_slab_pieces_source), to the same file.
  const fs::path shards_only = dir / fmt::format("shards-only{}", zero);
  fs::create_directories(shards_only);
  for (const auto& [name, bytes] : got)
    if (name != "model.safetensors") fs::copy_file(part / name, shards_only / name);
  const fs::path hf_a = dir / fmt::format("hf-a{}", zero), hf_b = dir / fmt::format("hf-b{}", zero);
  ASSERT_EQ(run(0, fmt::format("export --hf '{}' '{}'", hf_a.string(), part.string())), 0)
      << test::slurp(dir / "err.txt");
  ASSERT_EQ(run(0, fmt::format("export --hf '{}' '{}'", hf_b.string(), shards_only.string())), 0)
      << test::slurp(dir / "err.txt");
  const std::string a_model = test::slurp(hf_a / "model.safetensors");
  EXPECT_FALSE(a_model.empty());
  EXPECT_TRUE(a_model == test::slurp(hf_b / "model.safetensors"));
  // memfit sample reads the sharded save's weights from its shard files: the same text as from
  // its export (greedy, so any weight that differed would show).
  std::string text[2];
  const fs::path from[2] = {part, hf_a};
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(run(0, fmt::format("sample --checkpoint '{}' --tokenizer byte --prompt ab "
                                 "--tokens 12 --temperature 0",
                                 from[i].string())),
              0)
        << test::slurp(dir / "err.txt");
    text[i] = test::slurp(dir / "out.txt");
  }
  EXPECT_GE(text[0].size(), 2u);
  EXPECT_EQ(text[0], text[1]);
}

// Resharding on load: a checkpoint saved at one world size and stage loads at any other, and the
// state read back is the saved state exactly. Each load here runs no step (--stop-after the saved
// step) and saves again, so a round trip must give back the first save's files bit for bit:
// 1 -> 4 -> 1 ranks, 2 -> 3 -> 1 against 2 -> 1, and stage 1 -> stage 2 at 2 ranks (the same
// ranges, so the same shard files). 8-bit AdamW, whose shards cut at its 256-element blocks.
TEST_F(Zero, ShardedCheckpointsReshardAtAnyWorldSizeAndStage) {
  const std::string common = "--steps 4 --stop-after 2 --precision bf16 --optim adamw8bit";
  auto train = [&](int ranks, const std::string& more) {
    EXPECT_EQ(run(ranks, "train " + args(common + " " + more)), 0)
        << more << ": " << test::slurp(dir / "err.txt");
  };
  auto path = [&](const char* name) { return (dir / name).string(); };
  // The weights of two checkpoints, either of which may be sharded (no model.safetensors).
  auto same_weights = [&](const char* x, const char* y) {
    const std::string a = exported_weights(dir / x), b = exported_weights(dir / y);
    EXPECT_FALSE(a.empty()) << x;
    EXPECT_TRUE(a == b) << x << "'s weights differ from " << y << "'s";
  };
  auto same = [&](const char* x, const char* y, const char* file) {
    const std::string a = test::slurp(dir / x / file), b = test::slurp(dir / y / file);
    EXPECT_FALSE(a.empty()) << x << "/" << file;
    EXPECT_TRUE(a == b) << x << "/" << file << " differs from " << y << "'s";
  };
  // 1 -> 4 -> 1.
  train(0, fmt::format("--save '{}'", path("c1")));
  train(4, fmt::format("--zero 2 --resume '{}' --save '{}'", path("c1"), path("c4")));
  EXPECT_TRUE(fs::exists(dir / "c4" / "zero-rank-00003-of-00004.safetensors"));
  train(0, fmt::format("--resume '{}' --save '{}'", path("c4"), path("c41")));
  same("c1", "c41", "optimizer.safetensors");
  same("c1", "c41", "model.safetensors");
  // 2 -> 3 -> 1 and 2 -> 1.
  train(2, fmt::format("--zero 1 --save '{}'", path("c2")));
  train(3, fmt::format("--zero 1 --resume '{}' --save '{}'", path("c2"), path("c3")));
  EXPECT_TRUE(fs::exists(dir / "c3" / "zero-rank-00002-of-00003.safetensors"));
  train(0, fmt::format("--resume '{}' --save '{}'", path("c3"), path("c31")));
  train(0, fmt::format("--resume '{}' --save '{}'", path("c2"), path("c21")));
  same("c21", "c31", "optimizer.safetensors");
  same_weights("c2", "c31");
  // Stage 1 -> stage 2 at the same world size: the same shard files.
  train(2, fmt::format("--zero 2 --resume '{}' --save '{}'", path("c2"), path("c22")));
  same("c2", "c22", "zero-rank-00000-of-00002.safetensors");
  same("c2", "c22", "zero-rank-00001-of-00002.safetensors");
  // Stage 3 at 2 ranks saves stage 1's shard files (the same ranges, the same bits); it
  // reshards to 3 ranks at stage 3 and back to one process as 2 -> 1 does.
  train(2, fmt::format("--zero 3 --save '{}'", path("c23")));
  same("c2", "c23", "zero-rank-00000-of-00002.safetensors");
  same("c2", "c23", "zero-rank-00001-of-00002.safetensors");
  same_weights("c2", "c23");
  train(3, fmt::format("--zero 3 --resume '{}' --save '{}'", path("c23"), path("c33")));
  train(0, fmt::format("--resume '{}' --save '{}'", path("c33"), path("c331")));
  same("c21", "c331", "optimizer.safetensors");
  same_weights("c2", "c331");
  // A shard file missing: the resume is refused naming it, before any step.
  fs::copy(dir / "c2", dir / "c2-broken");
  fs::remove(dir / "c2-broken" / "zero-rank-00001-of-00002.safetensors");
  EXPECT_NE(run(0, "train " + args(common + fmt::format(" --resume '{}'", path("c2-broken")))), 0);
  EXPECT_NE(test::slurp(dir / "err.txt").find("zero-rank-00001-of-00002.safetensors is missing"),
            std::string::npos)
      << test::slurp(dir / "err.txt");
  // And 2 -> 3 ranks trains on from the checkpoint.
  const fs::path log = dir / "on.jsonl";
  ASSERT_EQ(run(3, "train " + args(fmt::format("--steps 4 --precision bf16 --optim adamw8bit "
                                               "--zero 2 --resume '{}' --log '{}'",
                                               path("c2"), log.string()))),
            0)
      << test::slurp(dir / "err.txt");
  int steps = 0;
  for (const json& j : lines(log))
    if (j.contains("loss")) {
      EXPECT_GT(j["step"].get<int>(), 2);
      EXPECT_TRUE(std::isfinite(j["loss"].get<double>()));
      ++steps;
    }
  EXPECT_EQ(steps, 2);
}

// --grad-dtype bf16 (Note [Gradients in bf16]): the summed gradients kept and reduced in bf16,
// at every stage the same sums in rank order, so stages 0-3 agree bit for bit as in f32 (with
// --sync-every-micro-batch under accumulation, clipping active, the saved weights compared).
TEST_F(Zero, StagesAreBitIdenticalWithBf16Gradients) {
  const auto logs = stages_agree(
      "--steps 3 --grad-accum 2 --sync-every-micro-batch --clip 0.05 --eval-batches 2 "
      "--grad-dtype bf16",
      true);
  for (const json& j : logs[0])
    if (j.contains("grad_norm")) { EXPECT_GT(j["grad_norm"].get<double>(), 0.05); }  // clipped
}

// fp16's scaler reads the bf16 sums (unscaled in place, its overflow found in them and agreed)
// and 8-bit AdamW takes them widened by chunks cut on its blocks: still the same bits at every
// stage, with overflowing (skipped) steps and updates.
TEST_F(Zero, StagesAreBitIdenticalWithBf16GradientsInFp16With8BitAdamW) {
  const auto logs =
      stages_agree("--steps 8 --precision fp16 --attention plain --optim adamw8bit "
                   "--initial-loss-scale 16777216 --eval-batches 2 --grad-dtype bf16",
                   false);
  int skipped = 0, updated = 0;
  for (const json& j : logs[0])
    if (j.contains("skipped")) (j["skipped"].get<bool>() ? skipped : updated) += 1;
  EXPECT_GT(skipped, 0);
  EXPECT_GT(updated, 0);
}

// The plan per rank with bf16 gradients is each rank's measured peak at every stage (the
// accumulator 2 bytes a parameter, the unit buffers and the bf16 receive ring, the update's
// widening buffer), and each step's collectives move half the f32 gradients' bytes.
TEST_F(Zero, ThePlanPerRankIsEachRanksMeasuredPeakWithBf16Gradients) {
  size_t state[4] = {}, f32_state[4] = {};
  expect_plan_per_rank(2, "--precision bf16 --grad-dtype bf16", state);
  EXPECT_LT(state[3], state[2]);
  for (int zero = 0; zero <= 3; ++zero) {
    const std::string a = args(fmt::format("--steps 2 --bucket-mb 0.25 --precision bf16 --zero {}", zero));
    json p[2];
    for (int i = 0; i < 2; ++i) {
      ASSERT_EQ(run(0, fmt::format("plan {}{} --world-size 2 --json", a,
                                   i ? " --grad-dtype bf16" : "")),
                0)
          << test::slurp(dir / "err.txt");
      p[i] = json::parse(test::slurp(dir / "out.txt"));
    }
    f32_state[zero] = p[0]["model_state_bytes"];
    const char* reduced = zero >= 2 ? "reduce_scatter" : "all_reduce";
    EXPECT_EQ(2 * p[1]["comm_per_step"][reduced].get<int64_t>(),
              p[0]["comm_per_step"][reduced].get<int64_t>()) << zero;
    EXPECT_EQ(p[1]["comm_per_step"]["all_gather"], p[0]["comm_per_step"]["all_gather"]) << zero;
    EXPECT_LT(state[zero], f32_state[zero]) << zero;
  }
}

// One process, 20 steps of the same rows: bf16 gradient sums against f32 ones. Each gradient
// is rounded to bf16 once (relative error <= 2^-9), and AdamW's update m / sqrt(v) divides most
// of that out: measured 1.3e-6 relative at worst over 20 steps here (gpt2-tiny, 2 x 128, lr
// 1e-3; 6.6e-7 on Brown's tokens); the bound is 1e-5, 7.7x that, and still 400x below the
// 2^-9 = 2e-3 relative error of the gradients themselves.
// The runs must differ (bf16 was used) and the gradients held must be 2 bytes a parameter.
TEST_F(Zero, Bf16GradientsStayWithinTheirBoundOfFp32) {
  std::vector<json> logs[2];
  for (int i = 0; i < 2; ++i) {
    const fs::path log = dir / fmt::format("g{}.jsonl", i);
    ASSERT_EQ(run(0, "train " + args(fmt::format("--steps 20 --lr 1e-3 --grad-dtype {} --log '{}'",
                                                   i ? "bf16" : "fp32", log.string()))),
              0)
        << test::slurp(dir / "err.txt");
    for (const json& j : lines(log))
      if (j.contains("loss")) logs[i].push_back(j);
  }
  ASSERT_EQ(logs[0].size(), 20u);
  ASSERT_EQ(logs[1].size(), 20u);
  double worst = 0;
  bool differ = false;
  for (size_t k = 0; k < 20; ++k) {
    const double a = logs[0][k]["loss"], b = logs[1][k]["loss"];
    worst = std::max(worst, std::abs(a - b) / std::abs(a));
    differ |= logs[0][k]["grad_norm"] != logs[1][k]["grad_norm"];
  }
  EXPECT_LT(worst, 1e-5) << worst;
  EXPECT_TRUE(differ) << "bf16 gradients gave f32's norms: were they kept in bf16?";
  // The f32 slab of one process lies in the activations arena (Note [Gradients by lifetime]):
  // its bytes as the plan places them there.
  EXPECT_FALSE(logs[0].back()["mem"].contains("grads"));
  ASSERT_EQ(run(0, "plan " + args("--steps 20 --json")), 0) << test::slurp(dir / "err.txt");
  const size_t g32 = json::parse(test::slurp(dir / "out.txt"))["grads_in_arena_bytes"];
  const size_t g16 = logs[1].back()["mem"]["grads"];
  EXPECT_NEAR(double(g16), g32 / 2.0, 64.0);
}

// Ranks must agree on the gradients' type: a run where one keeps bf16 sums and the other f32
// would exchange different bytes. Refused before the first step, naming the option.
TEST_F(Zero, RanksDisagreeingOnTheGradientTypeAreRefused) {
  const std::string binary = fmt::format("{}/memfit train ", MEMFIT_BINARY_DIR);
  const std::string command = fmt::format(
      "ASAN_OPTIONS=detect_leaks=0 {} --allow-run-as-root --oversubscribe -n 1 {}{} : -n 1 "
      "{}{} > '{}' 2> '{}'",
      MEMFIT_MPIEXEC, binary, args("--steps 2 --zero 2 --grad-dtype bf16"), binary,
      args("--steps 2 --zero 2"), (dir / "out.txt").string(), (dir / "err.txt").string());
  const int status = std::system(command.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 2) << status;
  EXPECT_NE(test::slurp(dir / "err.txt")
                .find("ranks disagree about --grad-dtype: rank 0 has bf16, rank 1 has fp32"),
            std::string::npos)
      << test::slurp(dir / "err.txt");
}

}  // namespace
}  // namespace memfit
