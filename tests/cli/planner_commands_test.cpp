// The memfit command's planner options end to end, through the built binary: `plan --auto
// --json` carries the choice and the options it rejected, `plan --max-model` its winner,
// `train --ckpt auto` runs the choice, and an out-of-memory `train` exits 3 with the planner's
// advice and writes no checkpoint. (The numbers themselves are tested in tests/plan/.)
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "memfit/memory/pool.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

using test::Output;
using test::slurp;

class PlannerCommands : public test::BinaryTest {
 protected:
  PlannerCommands() : BinaryTest(99) {}

  // memfit with environment assignments ("NAME=value ...") before the command.
  Output memfit_env(const std::string& env, const std::string& args) const {
    return memfit(args, env);
  }
  // gpt2-tiny with 4 blocks and plain attention, on this test's shards.
  std::string model() const {
    return fmt::format("--model gpt2-tiny --n-layer 4 --seq-len 32 --batch 4 --grad-accum 2 "
                       "--attention plain --eval-batches 1 --data '{}'",
                       (dir / "data").string());
  }
  // The run's predicted peak under a policy.
  size_t peak(const std::string& ckpt) const {
    const Output r = memfit(fmt::format("plan {} --ckpt {} --json", model(), ckpt));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return nlohmann::json::parse(r.out)["peak_bytes"].get<size_t>();
  }

};

TEST_F(PlannerCommands, PlanAutoJsonHasTheChoiceAndTheRejected) {
  const size_t none = peak("none"), full = peak("full");
  const size_t limit = full + (none - full) / 2;
  // The JSON and the text form below must rank by one calibration, so they read this test's
  // own cache, seeded from the suite's: a test beside this one may measure the suite's again
  // between the two commands (one measured while the CPUs were busy is, once they are quiet:
  // machine_calibration). Here only these commands measure, and say so; then the pair is run
  // again, on the calibration just saved.
  const fs::path cache = dir / "cache";
  fs::create_directories(cache);
  if (const char* suite = std::getenv("MEMFIT_CACHE_DIR"); suite && fs::is_directory(suite))
    for (const auto& f : fs::directory_iterator(suite))
      if (f.path().filename().string().starts_with("calibration-"))
        fs::copy_file(f.path(), cache / f.path().filename(), fs::copy_options::skip_existing);
  const std::string env = fmt::format("MEMFIT_CACHE_DIR='{}'", cache.string());
  Output r, text;
  for (int attempt = 0; attempt < 3; ++attempt) {
    r = memfit_env(env, fmt::format("plan {} --auto --mem-limit {} --json", model(), limit));
    text = memfit_env(env, fmt::format("plan {} --auto --mem-limit {}", model(), limit));
    if (r.err.find("calibrating") == std::string::npos &&
        text.err.find("calibrating") == std::string::npos)
      break;
  }
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& s = j["search"];
  EXPECT_TRUE(s["fits"].get<bool>());
  const std::string chosen = s["choice"]["ckpt"];
  EXPECT_EQ(j["ckpt"], chosen);  // the plan printed is the choice's
  const std::string compress = s["choice"]["act_compress"];  // --act-compress not given
  EXPECT_EQ(j["act_compress"], compress);
  const std::string options =
      "--ckpt " + chosen + (compress == "none" ? "" : " --act-compress " + compress);
  EXPECT_EQ(j["peak_bytes"], s["choice"]["peak_bytes"]);
  EXPECT_LE(j["peak_bytes"].get<size_t>(), limit);
  EXPECT_TRUE(j["fits"].get<bool>());
  ASSERT_FALSE(s["rejected_over_limit"].empty());
  for (const auto& o : s["rejected_over_limit"]) {
    EXPECT_GT(o["peak_bytes"].get<size_t>(), limit);
    EXPECT_EQ(o["over_bytes"].get<size_t>(), o["peak_bytes"].get<size_t>() - limit);
    EXPECT_LE(o["est_step_seconds"].get<double>(), s["choice"]["est_step_seconds"].get<double>());
  }
  ASSERT_FALSE(s["rejected_slower"].empty());
  for (const auto& o : s["rejected_slower"]) EXPECT_LE(o["peak_bytes"].get<size_t>(), limit);

  // The text form names the choice and tabulates the runner-ups.
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find(options + " fits"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("MiB over"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("chosen"), std::string::npos) << text.out;
}

TEST_F(PlannerCommands, ActCompressIsPlannedAndABadValueIsRefused) {
  const Output r = memfit(fmt::format("plan {} --act-compress fp8 --json", model()));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["act_compress"], "fp8");
  EXPECT_GT(j["step_time"]["compression"].get<double>(), 0);
  EXPECT_LT(j["peak_bytes"].get<size_t>(), peak("none"));
  const Output text = memfit(fmt::format("plan {} --act-compress int8", model()));
  EXPECT_NE(text.out.find("--act-compress int8"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("compression "), std::string::npos) << text.out;
  const Output bad = memfit(fmt::format("plan {} --act-compress int4", model()));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--act-compress"), std::string::npos) << bad.err;
}

TEST_F(PlannerCommands, AutoNeedsAMemLimit) {
  for (const char* args : {"plan --auto", "plan --auto-batch", "train --ckpt auto --steps 1"}) {
    const Output r = memfit(fmt::format("{} {}", args, model()));
    EXPECT_EQ(r.exit_code, 2) << args;
    EXPECT_NE(r.err.find("--mem-limit"), std::string::npos) << r.err;
  }
  const Output both = memfit(fmt::format("plan {} --auto --ckpt full --mem-limit 1GiB", model()));
  EXPECT_EQ(both.exit_code, 2);
  EXPECT_NE(both.err.find("--auto"), std::string::npos) << both.err;
}

// The precision levers (Note [Fit a budget], "Precision levers"): in bf16 with neither option
// given, `plan --auto` pulls --grad-dtype bf16, else --master-weights none, else both, only
// where nothing fits without them, the milder first, and names them; with a budget everything
// fits as asked, none; with either option given, none. The budget lies between the smallest
// footprints of the searches with the options fixed.
TEST_F(PlannerCommands, AutoPullsPrecisionLeversOnlyWhereNothingElseFits) {
  const std::string bf16 = model() + " --precision bf16";
  auto search = [&](const std::string& more, size_t limit) {
    const Output r =
        memfit(fmt::format("plan {} --auto --mem-limit {} --json {}", bf16, limit, more));
    EXPECT_TRUE(r.exit_code == 0 || r.exit_code == 3) << r.err;
    return nlohmann::json::parse(r.out);
  };
  auto smallest = [&](const std::string& fixed) {
    return search(fixed, 1024)["search"]["smallest"]["peak_bytes"].get<size_t>();
  };
  const size_t as_asked = smallest("--grad-dtype fp32 --master-weights fp32");
  // The masks 1, 2, 3 of the levers, as options.
  const std::vector<std::vector<std::string>> masks = {
      {"--grad-dtype bf16"}, {"--master-weights none"},
      {"--grad-dtype bf16", "--master-weights none"}};
  std::vector<size_t> pulled;
  for (const auto& m : masks) pulled.push_back(smallest(fmt::format("{}", fmt::join(m, " "))));
  const size_t least = *std::min_element(pulled.begin(), pulled.end());
  ASSERT_LT(least, as_asked);  // pure bf16 drops the master weights
  const size_t limit = (least + as_asked) / 2;
  size_t expected = 0;  // the first mask whose smallest fits
  while (pulled[expected] > limit) ++expected;
  const nlohmann::json j = search("", limit);
  const nlohmann::json& s = j["search"];
  ASSERT_TRUE(s["fits"].get<bool>()) << s.dump();
  EXPECT_EQ(s["choice"]["precision_levers"], nlohmann::json(masks[expected]));
  const bool grads = expected != 1, pure = expected != 0;
  EXPECT_EQ(j["grad_dtype"], grads ? "bf16" : "fp32");  // the plan printed is the choice's run
  EXPECT_EQ(j["master_weights"], pure ? "none" : "fp32");
  EXPECT_EQ(j["peak_bytes"], s["choice"]["peak_bytes"]);
  EXPECT_LE(j["peak_bytes"].get<size_t>(), limit);
  // The search as asked and each mask up to the one that fits, with as many candidates each.
  EXPECT_EQ(s["candidates_planned"].get<size_t>() % (expected + 2), 0u);
  // Everything fits as asked: no lever, though pure bf16 may be as fast and smaller.
  const nlohmann::json roomy = search("", size_t{1} << 30);
  EXPECT_EQ(roomy["search"]["choice"]["precision_levers"], nlohmann::json::array());
  EXPECT_EQ(roomy["grad_dtype"], "fp32");
  EXPECT_EQ(roomy["master_weights"], "fp32");
  // An option given closes the levers: nothing fits, and the advice names them.
  const Output given =
      memfit(fmt::format("plan {} --auto --mem-limit {} --grad-dtype fp32", bf16, limit));
  EXPECT_EQ(given.exit_code, 3) << given.out;
  EXPECT_NE(given.out.find("the planner's advice: these fit"), std::string::npos) << given.out;
  EXPECT_NE(given.out.find(fmt::format("{}", fmt::join(masks[expected], " "))), std::string::npos)
      << given.out;
  // The text names the levers in the choice.
  const Output text = memfit(fmt::format("plan {} --auto --mem-limit {}", bf16, limit));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find(fmt::format("{} fits", fmt::join(masks[expected], " "))),
            std::string::npos)
      << text.out;
}

// --zero auto: over several ranks `plan --auto` searches the stage and names each candidate's
// in the JSON; a stage given stays; with one rank the stage is 0 and the output says so; a bad
// value or no budget is refused naming the option.
TEST_F(PlannerCommands, ZeroAutoSearchesTheStageOverSeveralRanks) {
  const std::string bf16 = model() + " --precision bf16";
  const Output r =
      memfit(fmt::format("plan {} --auto --world-size 2 --mem-limit 1GiB --json", bf16));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& s = j["search"];
  EXPECT_TRUE(s["searched_zero"].get<bool>());
  EXPECT_TRUE(s["per_rank"].get<bool>());
  EXPECT_EQ(j["zero"], s["choice"]["zero"]);  // the plan printed is the choice's stage
  EXPECT_GT(j["step_time"]["comm"].get<double>(), 0);
  std::set<int> stages = {s["choice"]["zero"].get<int>()};
  for (const auto& c : s["rejected_slower"]) stages.insert(c["zero"].get<int>());
  EXPECT_GE(stages.size(), 2u) << s.dump();  // the runner-ups include other stages
  // A stage given is kept.
  const Output fixed =
      memfit(fmt::format("plan {} --auto --world-size 2 --zero 1 --mem-limit 1GiB --json", bf16));
  ASSERT_EQ(fixed.exit_code, 0) << fixed.err;
  const nlohmann::json f = nlohmann::json::parse(fixed.out);
  EXPECT_FALSE(f["search"]["searched_zero"].get<bool>());
  EXPECT_EQ(f["zero"], 1);
  EXPECT_EQ(f["search"]["choice"]["zero"], 1);
  // Text: the table has the stage column and the choice names it.
  const Output text =
      memfit(fmt::format("plan {} --ckpt none --zero auto --world-size 2 --mem-limit 1GiB", bf16));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("--zero "), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("per rank"), std::string::npos) << text.out;
  // One rank: stage 0, said.
  const Output one = memfit(fmt::format("plan {} --zero auto --mem-limit 1GiB", bf16));
  ASSERT_EQ(one.exit_code, 0) << one.err;
  EXPECT_NE(one.out.find("--zero auto with one rank: stage 0"), std::string::npos) << one.out;
  // Refusals.
  const Output bad = memfit(fmt::format("plan {} --zero two", bf16));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--zero must be 0, 1, 2, 3 or auto, got 'two'"), std::string::npos)
      << bad.err;
  const Output no_budget = memfit(fmt::format("plan {} --zero auto --world-size 2", bf16));
  EXPECT_EQ(no_budget.exit_code, 2);
  EXPECT_NE(no_budget.err.find("--zero auto"), std::string::npos) << no_budget.err;
  EXPECT_NE(no_budget.err.find("--mem-limit"), std::string::npos) << no_budget.err;
  // A config file says it as a string.
  const fs::path toml = dir / "zero.toml";
  std::ofstream(toml) << "zero = \"auto\"\nmem_limit = \"1GiB\"\nranks = 2\n";
  const Output file = memfit(fmt::format("plan {} --ckpt none --config '{}' --json", bf16,
                                         toml.string()));
  ASSERT_EQ(file.exit_code, 0) << file.err;
  EXPECT_TRUE(nlohmann::json::parse(file.out)["search"]["searched_zero"].get<bool>());
}

TEST_F(PlannerCommands, MaxModelPrintsAFittingShape) {
  const std::string args = fmt::format("plan --max-model --model gpt2-tiny --seq-len 32 --batch 2 "
                                       "--mem-limit 200MiB --data '{}'",
                                       (dir / "data").string());
  const Output r = memfit(args + " --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json m = nlohmann::json::parse(r.out)["max_model"];
  EXPECT_TRUE(m["found"].get<bool>());
  EXPECT_LE(m["best"]["peak_bytes"].get<size_t>(), size_t(200) << 20);
  EXPECT_EQ(m["best"]["d_model"].get<int>(), 64 * m["best"]["n_head"].get<int>());
  const Output text = memfit(args);
  EXPECT_NE(text.out.find(fmt::format("{} layers x {} wide", m["best"]["n_layer"].get<int>(),
                                      m["best"]["d_model"].get<int>())),
            std::string::npos)
      << text.out;
  EXPECT_EQ(memfit("plan --max-model --model gpt2-tiny").exit_code, 2);  // no --mem-limit
}

// --max-model in bf16 pulls the precision levers too (Note [Fit a budget], "Precision levers"):
// a larger member fits than with both options fixed as asked, and its choice names them.
TEST_F(PlannerCommands, MaxModelPullsPrecisionLeversInBf16) {
  const std::string args = fmt::format("plan --max-model --model gpt2-tiny --seq-len 32 --batch 2 "
                                       "--precision bf16 --mem-limit 200MiB --data '{}' --json",
                                       (dir / "data").string());
  const Output pulled = memfit(args), fixed =
      memfit(args + " --grad-dtype fp32 --master-weights fp32");
  ASSERT_EQ(pulled.exit_code, 0) << pulled.err;
  ASSERT_EQ(fixed.exit_code, 0) << fixed.err;
  const nlohmann::json p = nlohmann::json::parse(pulled.out)["max_model"]["best"];
  const nlohmann::json f = nlohmann::json::parse(fixed.out)["max_model"]["best"];
  EXPECT_GT(p["params"].get<int64_t>(), f["params"].get<int64_t>());
  EXPECT_FALSE(p["precision_levers"].empty()) << p.dump();
  EXPECT_TRUE(f["precision_levers"].empty()) << f.dump();
}

TEST_F(PlannerCommands, TrainAutoRunsTheChoiceAndOutOfMemoryAdvises) {
  const size_t none = peak("none"), full = peak("full");
  const size_t limit = full + (none - full) / 2;
  const fs::path save = dir / "ckpt";
  const Output oom = memfit(fmt::format("train {} --steps 1 --mem-limit {} --save '{}'", model(),
                                     limit, save.string()));
  EXPECT_EQ(oom.exit_code, 3) << oom.out << oom.err;
  EXPECT_NE(oom.err.find("out of memory"), std::string::npos) << oom.err;
  EXPECT_NE(oom.err.find("live"), std::string::npos) << oom.err;
  EXPECT_NE(oom.err.find("the planner's advice"), std::string::npos) << oom.err;
  EXPECT_NE(oom.err.find("--ckpt "), std::string::npos) << oom.err;
  EXPECT_FALSE(fs::exists(save));

  const Output ok = memfit(fmt::format("train {} --steps 1 --ckpt auto --mem-limit {} --save '{}'",
                                    model(), limit, save.string()));
  ASSERT_EQ(ok.exit_code, 0) << ok.out << ok.err;
  EXPECT_NE(ok.out.find("planner: --ckpt "), std::string::npos) << ok.out;
  // The plan against the measurement at the end: the search's line says "fits LIMIT: predicted
  // peak PEAK (", the end "planned PEAK under --mem-limit LIMIT".
  const size_t fits = ok.out.find(" fits ", ok.out.find("planner: ")),
               peak_at = ok.out.find(": predicted peak ", fits);
  ASSERT_NE(peak_at, std::string::npos) << ok.out;
  const std::string limit_text = ok.out.substr(fits + 6, peak_at - fits - 6);
  const std::string peak_text =
      ok.out.substr(peak_at + 17, ok.out.find(" (", peak_at) - peak_at - 17);
  EXPECT_NE(ok.out.find("peak memory: measured "), std::string::npos) << ok.out;
  EXPECT_NE(ok.out.find(fmt::format("planned {} under --mem-limit {}\n", peak_text, limit_text)),
            std::string::npos)
      << ok.out;
  const nlohmann::json state = nlohmann::json::parse(slurp(save / "trainer_state.json"));
  EXPECT_NE(state["ckpt"], "auto");
  // Something gave: recomputation, or (--act-compress not given) compression, recorded.
  EXPECT_TRUE(state["ckpt"] != "none" || state["act_compress"] != "none") << state.dump();
  if (state["act_compress"] != "none") {
    EXPECT_NE(ok.out.find("--act-compress " + state["act_compress"].get<std::string>()),
              std::string::npos)
        << ok.out;
  }
}

// --offload-params nvme (Note [NVMe offload], "Working weights on disk"): the plan's JSON has the
// params file, its reads and write-back per step and the ring, the pool's params shrink to the
// embeddings and the tail, the text says so, and without --offload-optimizer train refuses it
// (exit 2) naming both options.
TEST_F(PlannerCommands, OffloadParamsIsPlannedPrintedAndNeedsTheOptimizerOffloaded) {
  const std::string off = fmt::format("--offload-dir '{}'", (dir / "off").string());
  const Output ram = memfit(fmt::format("plan {} --ckpt full --json", model()));
  ASSERT_EQ(ram.exit_code, 0) << ram.err;
  const Output r = memfit(fmt::format(
      "plan {} --ckpt full --offload-optimizer nvme --offload-params nvme {} --json", model(), off));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& p = j["offload"]["params"];
  EXPECT_GT(p["file_bytes"].get<uint64_t>(), 4096u);
  EXPECT_GT(p["read_bytes_per_step"].get<uint64_t>(), p["written_bytes_per_step"].get<uint64_t>());
  EXPECT_GT(p["ring_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(p["prefetch_depth"].get<int>(), 1);
  EXPECT_EQ(j["offload"]["disk_by_category"]["params"].get<uint64_t>(),
            p["file_bytes"].get<uint64_t>());
  EXPECT_LT(j["by_category"]["params"].get<size_t>(),
            nlohmann::json::parse(ram.out)["by_category"]["params"].get<size_t>());
  const Output text = memfit(fmt::format(
      "plan {} --ckpt full --offload-optimizer nvme --offload-params nvme {}", model(), off));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("the blocks' working weights on disk too"), std::string::npos)
      << text.out;
  const Output bad =
      memfit(fmt::format("train {} --ckpt full --steps 1 --offload-params nvme {}", model(), off));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("--offload-params nvme needs --offload-optimizer nvme"),
            std::string::npos)
      << bad.err;
}

TEST_F(PlannerCommands, PlanNeedsNoDataDirectory) {
  // From an empty folder (the default --data, data/brown, does not exist there): the plan counts
  // the train and val loaders' fixed staging, (B, T + 1) int32 and two (B, T) int32 each.
  fs::create_directories(dir / "empty");
  const Output here = [&] {
    const std::string command = fmt::format(
        "cd '{}' && {}/memfit plan --model gpt2 --batch 8 --seq-len 256 --json > '{}' 2> '{}'",
        (dir / "empty").string(), MEMFIT_BINARY_DIR, (dir / "out.txt").string(),
        (dir / "err.txt").string());
    const int status = std::system(command.c_str());
    return Output{WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir / "out.txt"),
                  slurp(dir / "err.txt")};
  }();
  ASSERT_EQ(here.exit_code, 0) << here.err;
  const nlohmann::json j = nlohmann::json::parse(here.out);
  EXPECT_FALSE(j["data_included"].get<bool>());
  const size_t staging = 2 * (MemoryPool::round_up(8 * 257 * 4) + 2 * MemoryPool::round_up(8 * 256 * 4));
  EXPECT_EQ(j["by_category"]["staging"].get<size_t>(), staging);
  EXPECT_GT(j["est_step_seconds"].get<double>(), 0);
  const Output text = memfit("plan --model gpt2 --batch 8 --seq-len 256 --data /nonexistent");
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("no training data found"), std::string::npos) << text.out;
}

TEST_F(PlannerCommands, PlanHonoursThreads) {
  // Flash attention's workspace is per thread: --threads changes the plan (on a machine with
  // more than one core) and the plan then equals what `train --threads` measures.
  for (int threads : {1, 2}) {
    const std::string run = fmt::format(
        "--model gpt2-tiny --n-layer 4 --seq-len 32 --batch 4 --eval-batches 1 --data '{}' "
        "--attention flash --threads {}",
        (dir / "data").string(), threads);
    const Output plan = memfit(fmt::format("plan {} --json", run));
    ASSERT_EQ(plan.exit_code, 0) << plan.err;
    const fs::path log = dir / fmt::format("log{}.jsonl", threads);
    const Output train = memfit(fmt::format("train {} --steps 1 --log '{}'", run, log.string()));
    ASSERT_EQ(train.exit_code, 0) << train.err;
    const std::string first = slurp(log).substr(0, slurp(log).find('\n'));
    EXPECT_EQ(nlohmann::json::parse(plan.out)["peak_bytes"].get<size_t>(),
              nlohmann::json::parse(first)["peak_bytes"].get<size_t>())
        << "--threads " << threads;
  }
}

TEST_F(PlannerCommands, CalibrateSavesItsRatesWhereThePlannerReadsThem) {
  // Each command gets this test's own cache folder; the ISA cap and the thread count key it.
  const std::string env = fmt::format("MEMFIT_CACHE_DIR='{}'", (dir / "cache").string());
  const Output r = memfit_env(env, "calibrate --threads 1 --json");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json c = nlohmann::json::parse(r.out);
  const fs::path path = c["path"].get<std::string>();
  EXPECT_TRUE(fs::exists(path));
  EXPECT_EQ(path.parent_path(), dir / "cache");
  EXPECT_NE(path.filename().string().find("-1t.json"), std::string::npos) << path;
  EXPECT_EQ(c["threads"], 1);
  for (const auto& g : c["gemm_flops_per_s"]) EXPECT_GT(g["f32_block"].get<double>(), 0);

  // memfit plan reads it (no calibration message) and prints an estimate. Unless other work
  // (a test beside this one) kept the CPUs busy while it measured and the machine is quiet
  // when the planner looks: then it measures again, saying that this file was busy.
  const Output plan = memfit_env(env, "plan --model gpt2-tiny --threads 1 --json");
  ASSERT_EQ(plan.exit_code, 0) << plan.err;
  if (plan.err.find("calibrating") != std::string::npos) {
    EXPECT_NE(plan.err.find(path.string() + " was measured while other work kept"),
              std::string::npos) << plan.err;
  }
  EXPECT_GT(nlohmann::json::parse(plan.out)["est_step_seconds"].get<double>(), 0);

  // Under the AVX2 cap (on a CPU with more) the file is another one, and bf16 matmuls there
  // have no native GEMM: their rate is the f32 one. (The text form, with where it saved.)
  const Output capped = memfit_env(env + " MEMFIT_MAX_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2",
                                   "calibrate --threads 1");
  ASSERT_EQ(capped.exit_code, 0) << capped.err;
  const fs::path capped_path = dir / "cache" / path.filename().string().replace(
      path.filename().string().rfind(c["isa"].get<std::string>()),
      c["isa"].get<std::string>().size(), "avx2");
  EXPECT_NE(capped.out.find("saved to " + capped_path.string()), std::string::npos)
      << capped.out;
  EXPECT_NE(capped.out.find("no native GEMM here"), std::string::npos) << capped.out;
  const nlohmann::json a = nlohmann::json::parse(slurp(capped_path));
  EXPECT_EQ(a["isa"], "avx2");
  EXPECT_FALSE(a["bf16_native"].get<bool>());
  for (const auto& g : a["gemm_flops_per_s"])
    EXPECT_EQ(g["bf16_block"].get<double>(), g["f32_block"].get<double>());
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

// --offload-grads nvme in `memfit plan` (Note [NVMe offload], "Gradients on disk"): llama2-7b's
// grads in RAM are the unit buffers instead of the 25.7 GiB slab, the gradients' file is on
// the disk list, the text says what grads holds; --max-model finds a larger member under 4 GiB
// (18 layers against 13 without; at 16 GiB, 32 against 23, each search took 5x as long, 190 s of
// the sanitizer stage); several ranks are refused (exit 2).
TEST_F(PlannerCommands, OffloadGradsIsPlannedAndGrowsTheLargestModel) {
  const std::string base = fmt::format(
      "plan --model llama2-7b --seq-len 512 --batch 1 --precision bf16 --optim adamw8bit "
      "--offload-optimizer nvme --offload-dir '{}' --disk-limit 2000GiB",
      (dir / "off").string());
  const Output ram = memfit(base + " --ckpt full --json");
  const Output off = memfit(base + " --ckpt full --offload-grads nvme --json");
  ASSERT_EQ(ram.exit_code, 0) << ram.err;
  ASSERT_EQ(off.exit_code, 0) << off.err;
  const nlohmann::json a = nlohmann::json::parse(ram.out), b = nlohmann::json::parse(off.out);
  const size_t slab = a["by_category"]["grads"].get<size_t>();
  EXPECT_LT(b["by_category"]["grads"].get<size_t>() * 9, slab);
  EXPECT_EQ(b["offload"]["disk_by_category"]["grads"].get<size_t>() >= slab, true);
  EXPECT_FALSE(a["offload"]["disk_by_category"].contains("grads"));
  EXPECT_TRUE(b["offload"]["grads"].get<bool>());
  // Written by the backward and read by the update: twice the slab, pages rounded.
  EXPECT_GE(b["offload"]["io_bytes_per_step"].get<uint64_t>(),
            a["offload"]["io_bytes_per_step"].get<uint64_t>() + 2 * slab);
  const Output text = memfit(base + " --ckpt full --offload-grads nvme");
  EXPECT_NE(text.out.find("offload-grads: no gradient slab"), std::string::npos) << text.out;
  auto max_model = [&](const std::string& grads, bool json) {
    const Output r = memfit(base + " --max-model --mem-limit 4GiB" +
                            (grads.empty() ? "" : " --offload-grads " + grads) +
                            (json ? " --json" : ""));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return r.out;
  };
  auto best = [&](const std::string& grads) {
    return nlohmann::json::parse(max_model(grads, true))["max_model"]["best"];
  };
  const nlohmann::json given = best("nvme"), open = best("");
  EXPECT_GT(given["n_layer"].get<int>(), best("none")["n_layer"].get<int>());
  // Not given: the search may keep the gradients on disk (one process), and does where that
  // fits a larger member.
  EXPECT_EQ(open["n_layer"], given["n_layer"]);
  EXPECT_TRUE(open["offload_grads"].get<bool>());
  // The winner line names every offload option of the choice.
  const std::string printed = max_model("nvme", false);
  const std::string winner = printed.substr(0, printed.find('\n'));
  EXPECT_NE(winner.find("--offload-optimizer nvme --offload-grads nvme"), std::string::npos)
      << winner;
  EXPECT_NE(printed.find("with the optimizer and the gradients offloaded"), std::string::npos)
      << printed;
  const Output ranks = memfit(base + " --ckpt full --offload-grads nvme --world-size 2 --zero 2");
  EXPECT_EQ(ranks.exit_code, 2);
  EXPECT_NE(ranks.err.find("--offload-grads nvme is for one process"), std::string::npos)
      << ranks.err;
}

// --tp (Note [Tensor parallel]): model.params is one rank's slab and model.whole_params the whole
// model's (the plan without --tp's params); the text names the tensor collectives per step and
// their seconds; the JSON carries them and each block's kept bytes. bf16 with --tp, which train
// refuses (tests/cli/resolve_train_spec_test.cpp), is planned and said unbuilt.
TEST_F(PlannerCommands, PlanTpGivesTheWholeModelAndTheTensorCollectives) {
  const Output whole = memfit(fmt::format("plan {} --json", model()));
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  const Output split = memfit(fmt::format("plan {} --world-size 2 --tp 2 --json", model()));
  ASSERT_EQ(split.exit_code, 0) << split.err;
  const nlohmann::json w = nlohmann::json::parse(whole.out), t = nlohmann::json::parse(split.out);
  EXPECT_EQ(w["model"]["params"], w["model"]["whole_params"]);
  EXPECT_EQ(t["model"]["whole_params"], w["model"]["params"]);
  EXPECT_LT(t["model"]["params"].get<int64_t>(), w["model"]["params"].get<int64_t>());
  EXPECT_EQ(t["tensor_comm_per_step"]["all_reduce_count"].get<int>(), 2 * 18);  // 4 blocks, 2 micro-batches
  EXPECT_EQ(t["tensor_comm_per_step"]["all_reduce_each"].get<int64_t>(), 4 * 32 * 96 * 4);
  EXPECT_GT(t["step_time"]["tensor_comm"].get<double>(), 0);
  EXPECT_EQ(t["step_time"]["tensor_comm"], t["tensor_comm_per_step"]["seconds"]);
  EXPECT_EQ(w["step_time"]["tensor_comm"].get<double>(), 0);
  ASSERT_EQ(t["block_activations"]["per_block"].size(), 4u);
  EXPECT_LT(t["block_activations"]["per_block"][0].get<int64_t>(),
            w["block_activations"]["per_block"][0].get<int64_t>());
  // Without --world-size the plan takes the ranks --tp needs (one data rank).
  const Output alone = memfit(fmt::format("plan {} --tp 2 --json", model()));
  ASSERT_EQ(alone.exit_code, 0) << alone.err;
  EXPECT_EQ(nlohmann::json::parse(alone.out)["model"]["params"], t["model"]["params"]);
  const Output text = memfit(fmt::format("plan {} --world-size 2 --tp 2", model()));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("tensor collectives per step (--tp 2): 36 all-reduces"),
            std::string::npos)
      << text.out;
  EXPECT_NE(text.out.find("in the whole model"), std::string::npos) << text.out;
}

// --pp: the step as the schedule runs it (m + p - 1 slots, the bubble (p - 1)/m of the ideal),
// the activations sent between the stages priced on the link the cut spans, and each priced
// number said to be a model; a bad --link is refused naming it.
TEST_F(PlannerCommands, PlanPpPricesTheBubbleAndTheTransfersOnTheLinks) {
  const std::string a = fmt::format(
      "plan --model llama-tiny --n-layer 4 --seq-len 32 --batch 2 --grad-accum 4 --pp 2 "
      "--data '{}'",
      (dir / "data").string());
  const Output one_node = memfit(a + " --json");
  ASSERT_EQ(one_node.exit_code, 0) << one_node.err;
  const nlohmann::json p = nlohmann::json::parse(one_node.out);
  const nlohmann::json& t = p["pipeline_time"];
  EXPECT_DOUBLE_EQ(t["bubble_fraction"].get<double>(), 1.0 / 4);
  EXPECT_EQ(t["slots"].get<int>(), 4 + 2 - 1);
  EXPECT_EQ(t["p2p_bytes"].get<int64_t>(), 2 * 32 * 96 * 4);
  EXPECT_EQ(t["cut_inter"], nlohmann::json::array({false}));
  EXPECT_DOUBLE_EQ(p["est_step_seconds"].get<double>(), t["step_seconds"].get<double>());
  EXPECT_NEAR(t["step_seconds"].get<double>(),
              5 * t["slot_seconds"].get<double>() + t["once_seconds"].get<double>(),
              1e-12 * t["step_seconds"].get<double>());
  EXPECT_EQ(t["note"], "a model, not a measurement");
  EXPECT_EQ(p["links"]["note"], "a model, not a measurement");
  EXPECT_EQ(p["links"]["inter"]["source"], "estimate");
  ASSERT_EQ(p["stages"].size(), 2u);
  EXPECT_GT(p["stages"][0]["micro_batch_seconds"].get<double>(), 0);
  EXPECT_NE(p["pp_layers_note"].get<std::string>().find("--pp-layers auto"), std::string::npos);
  // One rank a node: the cut crosses nodes, each stage's send priced on --link inter.
  const Output across = memfit(a + " --ranks-per-node 1 --link inter=1GB/s,50us --json");
  ASSERT_EQ(across.exit_code, 0) << across.err;
  const nlohmann::json q = nlohmann::json::parse(across.out);
  EXPECT_EQ(q["pipeline_time"]["cut_inter"], nlohmann::json::array({true}));
  for (int s : {0, 1})
    EXPECT_NEAR(q["stages"][s]["p2p_seconds"].get<double>(), 2 * 32 * 96 * 4 / 1e9 + 50e-6,
                1e-15);
  EXPECT_EQ(q["links"]["inter"]["source"], "--link");
  const Output text = memfit(a);
  ASSERT_EQ(text.exit_code, 0) << text.err;
  for (const char* says : {"a model, not a measurement", "bubble:", "(p - 1)/m = 1/4",
                           "point to point:", "links: intra"})
    EXPECT_NE(text.out.find(says), std::string::npos) << says << "\n" << text.out;
  const Output bad = memfit(a + " --link inter=fast,5us");
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_TRUE(bad.says("--link inter=fast,5us")) << bad.err;
}

}  // namespace
}  // namespace memfit
