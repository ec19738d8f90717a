// The memfit command's planner options end to end, through the built binary: `plan --auto
// --json` carries the choice and the options it rejected, `plan --max-model` its winner,
// `train --ckpt auto` runs the choice, and an out-of-memory `train` exits 3 with the planner's
// advice and writes no checkpoint. (The numbers themselves are tested in tests/plan/.)
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "memfit/io/token_shard.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

struct Output {
  int exit_code;
  std::string out, err;
};

std::string slurp(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

class PlannerCommands : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(fs::path(MEMFIT_BINARY_DIR) / "memfit")) GTEST_SKIP() << "memfit not built";
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir = fs::temp_directory_path() / fmt::format("memfit_cli_{}_{}", ::getpid(), info->name());
    fs::remove_all(dir);
    fs::create_directories(dir / "data");
    std::vector<uint16_t> train(4000), val(800);
    uint32_t x = 99;
    for (auto& t : train) t = static_cast<uint16_t>((x = x * 1103515245u + 12345u) >> 16) % 500;
    for (auto& t : val) t = static_cast<uint16_t>((x = x * 1103515245u + 12345u) >> 16) % 500;
    io::write_token_shard(dir / "data" / "train_000000.bin", train);
    io::write_token_shard(dir / "data" / "val_000000.bin", val);
  }
  void TearDown() override { fs::remove_all(dir); }

  Output memfit(const std::string& args) const {
    const std::string command =
        fmt::format("{}/memfit {} > '{}' 2> '{}'", MEMFIT_BINARY_DIR, args,
                    (dir / "out.txt").string(), (dir / "err.txt").string());
    const int status = std::system(command.c_str());
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, slurp(dir / "out.txt"),
            slurp(dir / "err.txt")};
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

  fs::path dir;
};

TEST_F(PlannerCommands, PlanAutoJsonHasTheChoiceAndTheRejected) {
  const size_t none = peak("none"), full = peak("full");
  const size_t limit = full + (none - full) / 2;
  const Output r = memfit(fmt::format("plan {} --auto --mem-limit {} --json", model(), limit));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const nlohmann::json& s = j["search"];
  EXPECT_TRUE(s["fits"].get<bool>());
  const std::string chosen = s["choice"]["ckpt"];
  EXPECT_EQ(j["ckpt"], chosen);  // the plan printed is the choice's
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
  const Output text = memfit(fmt::format("plan {} --auto --mem-limit {}", model(), limit));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("--ckpt " + chosen + " fits"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("MiB over"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("chosen"), std::string::npos) << text.out;
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
  const nlohmann::json state = nlohmann::json::parse(slurp(save / "trainer_state.json"));
  EXPECT_NE(state["ckpt"], "auto");
  EXPECT_NE(state["ckpt"], "none");
}

}  // namespace
}  // namespace memfit
