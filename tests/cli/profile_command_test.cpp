// The profile through the memfit binary: --fail-on-leak exits with 4 and names the test hook's
// leak by tag, a clean run exits 0 and prints the profile's summary and the leak check; a bad
// --profile-steps is refused with exit 2; profile-diff compares --ckpt none with --ckpt full
// (and refuses a missing profile); under mpirun each rank writes its own profile, each tensor
// rank and pipeline stage too.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <string>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

class ProfileCommand : public test::BinaryTest {
 protected:
  ProfileCommand() : BinaryTest(777) {}
  // Runs `memfit args` (under mpirun with `ranks` > 0); returns the exit code.
  int run(const std::string& args, int ranks = 0) const {
    return run_memfit(args, ranks);
  }
  std::string train(int steps, const std::string& more) const {
    return fmt::format("train --model gpt2-tiny --seq-len 32 --batch 2 --steps {} --eval-batches 1 "
                       "--threads 1 --data '{}' {}",
                       steps, (dir / "data").string(), more);
  }
  std::string out() const { return test::slurp(dir / "out.txt"); }
  std::string err() const { return test::slurp(dir / "err.txt"); }
};

TEST_F(ProfileCommand, FailOnLeakExitsWith4AndNamesTheLeak) {
  EXPECT_EQ(run(train(3, "--fail-on-leak --test-leak-bytes 512")), 4) << err();
  EXPECT_NE(err().find("test.leak (workspace)"), std::string::npos) << err();
  EXPECT_NE(err().find("grew by 1024 B"), std::string::npos) << err();
}

TEST_F(ProfileCommand, CleanRunPrintsTheProfileAndPassesTheLeakCheck) {
  const fs::path p = dir / "prof";
  ASSERT_EQ(run(train(3, fmt::format("--fail-on-leak --profile '{}' --profile-steps 2", p.string()))), 0)
      << err();
  for (const char* part : {"memfit profile:", "top ", "live bytes per phase", "leak check:",
                           "never passed step 1's", "resident outside the pool"})
    EXPECT_NE(out().find(part), std::string::npos) << part << " not in:\n" << out();
  for (const char* f : {"trace.json", "memory.html", "summary.json", "leak.json"})
    EXPECT_TRUE(fs::exists(p / f)) << f;
  EXPECT_EQ(json::parse(test::slurp(p / "summary.json"))["profile"]["steps"], json::array({1, 2}));
}

TEST_F(ProfileCommand, RefusesProfileStepsBelowOne) {
  EXPECT_EQ(run(train(1, fmt::format("--profile '{}' --profile-steps 0", (dir / "p").string()))), 2);
  EXPECT_NE(err().find("--profile-steps must be >= 1, got 0"), std::string::npos) << err();
}

// (Two micro-batches a step keep the gradient slab out of the activations arena, Note
// [Gradients by lifetime]: at this size the slab is most of that arena either way.)
TEST_F(ProfileCommand, DiffShowsWhatCheckpointingChanges) {
  ASSERT_EQ(run(train(1, fmt::format("--grad-accum 2 --profile '{}'", (dir / "none").string()))),
            0)
      << err();
  ASSERT_EQ(run(train(1, fmt::format("--grad-accum 2 --ckpt full --profile '{}'",
                                     (dir / "full").string()))),
            0)
      << err();
  ASSERT_EQ(run(fmt::format("profile-diff '{}' '{}'", (dir / "none").string(),
                            (dir / "full").string())),
            0)
      << err();
  for (const char* part : {"\"none\"", "\"full\"", "activations", "buffers that changed",
                           "rc.*.", "h.*.", "most live bytes"})
    EXPECT_NE(out().find(part), std::string::npos) << part << " not in:\n" << out();
  ASSERT_EQ(run(fmt::format("profile-diff --json '{}' '{}'", (dir / "none").string(),
                            (dir / "full").string())),
            0);
  const json d = json::parse(out());
  bool activations_fell = false;
  for (const json& c : d["categories"])
    if (c["category"] == "activations") activations_fell = c["change"].get<double>() < 0;
  EXPECT_TRUE(activations_fell) << d.dump(1);
}

TEST_F(ProfileCommand, DiffRefusesAMissingProfile) {
  EXPECT_EQ(run(fmt::format("profile-diff '{}' '{}'", (dir / "a").string(), (dir / "b").string())), 2);
  EXPECT_NE(err().find("no profile at"), std::string::npos) << err();
}

TEST_F(ProfileCommand, EachRankWritesItsProfileUnderMpirun) {
  if (std::string(MEMFIT_MPIEXEC).empty()) GTEST_SKIP() << "memfit was built without MPI";
  const fs::path p = dir / "mpi";
  ASSERT_EQ(run(train(2, fmt::format("--profile '{}' --profile-steps 2", p.string())), 2), 0)
      << err();
  for (int r = 0; r < 2; ++r) {
    const fs::path rank = p / fmt::format("rank{}", r);
    const json s = json::parse(test::slurp(rank / "summary.json"));
    EXPECT_EQ(s["run"]["rank"], r);
    EXPECT_GT(s["measured"]["by_category"].value("comm", 0), 0) << "rank " << r;
    EXPECT_EQ(s["measured"]["by_category"], s["planned"]["by_category"]) << "rank " << r;
    const json trace = json::parse(test::slurp(rank / "trace.json"));
    size_t total = 0;
    bool collective = false;
    for (const json& e : trace["traceEvents"]) {
      if (e["ph"] == "C" && e["name"] == "pool.total") total = std::max(total, e["args"]["bytes"].get<size_t>());
      collective |= e["ph"] == "X" && e.value("cat", "") == "collective";
    }
    EXPECT_EQ(total, s["measured"]["peak_bytes"].get<size_t>()) << "rank " << r;
    EXPECT_TRUE(collective) << "rank " << r;
  }
}

// --tp and --pp: every world rank writes its own directory (the tensor ranks and stages of one
// data rank hold other bytes), each summary its own plan, by category, and its place in the grid.
TEST_F(ProfileCommand, EachTensorRankAndStageWritesItsProfile) {
  if (std::string(MEMFIT_MPIEXEC).empty()) GTEST_SKIP() << "memfit was built without MPI";
  for (const char* layout : {"--tp 2", "--pp 2 --n-layer 2 --grad-accum 2"}) {
    const fs::path p = dir / (std::string(layout).substr(2, 2));
    ASSERT_EQ(run(train(2, fmt::format("{} --profile '{}' --profile-steps 2", layout, p.string())),
                  2),
              0)
        << layout << ": " << err();
    for (int r = 0; r < 2; ++r) {
      const json s = json::parse(test::slurp(p / fmt::format("rank{}", r) / "summary.json"));
      EXPECT_EQ(s["run"]["world_rank"], r) << layout;
      EXPECT_EQ(s["run"][layout[2] == 't' ? "tensor_rank" : "stage"], r) << layout;
      EXPECT_EQ(s["measured"]["by_category"], s["planned"]["by_category"])
          << layout << ", rank " << r;
    }
  }
}

}  // namespace
}  // namespace memfit
