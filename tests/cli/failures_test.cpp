// Failures under mpirun end the whole job, through the built binary with real processes (Note
// [Failures] in docs/notes/zero.md): a rank killed with SIGKILL mid-run, a rank that stops
// (SIGSTOP) and so never joins the next collective, and an error on one rank alone each make
// mpirun exit non-zero within 30 seconds; ranks started with different options or data fail
// before the first step with one message naming the difference; MEMFIT_CHECK_COLLECTIVES=1
// trains as without it. Skips where memfit was built without MPI.
#include <gtest/gtest.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "cli_test_util.h"
#include "../support/scoped_env.h"

extern char** environ;

namespace memfit {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using test::slurp;

constexpr auto kLimit = 30s;  // the bound for a failed job to end

class Failures : public test::MpiBinaryTest {
 protected:
  Failures() : MpiBinaryTest(99) {}
  void TearDown() override {
    if (pid_ > 0) {  // a job a failed test left behind
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    BinaryTest::TearDown();
  }
  std::string memfit() const { return (fs::path(MEMFIT_BINARY_DIR) / "memfit").string(); }
  // `memfit train` on gpt2-tiny with `extra` options (one rank's command of an MPMD launch);
  // --data and --eval-every unless `extra` gives them.
  std::vector<std::string> train(int64_t steps, const std::vector<std::string>& extra = {}) const {
    std::vector<std::string> a = {memfit(), "train", "--model", "gpt2-tiny", "--n-layer", "2",
                                  "--seq-len", "32", "--batch", "2", "--threads", "1",
                                  "--steps", std::to_string(steps), "--log",
                                  (dir / "log.jsonl").string()};
    auto given = [&](const char* o) { return std::find(extra.begin(), extra.end(), o) != extra.end(); };
    if (!given("--data")) a.insert(a.end(), {"--data", (dir / "data").string()});
    if (!given("--eval-every")) a.insert(a.end(), {"--eval-every", "0"});
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // mpirun with one rank per command (an MPMD launch: `-n 1 a : -n 1 b`), output to files in
  // dir; the job's pid.
  pid_t launch(const std::vector<std::vector<std::string>>& ranks) {
    std::vector<std::string> args = {MEMFIT_MPIEXEC, "--allow-run-as-root", "--oversubscribe"};
    for (size_t i = 0; i < ranks.size(); ++i) {
      if (i) args.push_back(":");
      args.insert(args.end(), {"-n", "1"});
      args.insert(args.end(), ranks[i].begin(), ranks[i].end());
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string out = (dir / "out.txt").string(), err = (dir / "err.txt").string();
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<char*> argv;
    for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    // OpenMPI's own allocations at exit are not memfit's: no leak report in the sanitizer build.
    {
      const test::ScopedEnv asan("ASAN_OPTIONS", "detect_leaks=0");
      EXPECT_EQ(posix_spawn(&pid_, argv[0], &fa, nullptr, argv.data(), environ), 0);
    }
    posix_spawn_file_actions_destroy(&fa);
    return pid_;
  }
  // The job's exit code (128 + signal when killed), or -1 when it is still running after
  // `limit`; `seconds` how long it took.
  int wait_job(std::chrono::seconds limit, double* seconds = nullptr) {
    const auto t0 = std::chrono::steady_clock::now();
    for (;;) {
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        if (seconds)
          *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      if (std::chrono::steady_clock::now() - t0 > limit) return -1;
      std::this_thread::sleep_for(20ms);
    }
  }
  // Waits (60 s at most) until the log has `n` steps.
  bool wait_steps(int n) const {
    for (auto until = std::chrono::steady_clock::now() + 60s;
         std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(20ms)) {
      std::ifstream in(dir / "log.jsonl");
      int lines = 0;
      for (std::string l; std::getline(in, l);) lines += l.find("\"loss\"") != std::string::npos;
      if (lines >= n) return true;
    }
    return false;
  }
  std::string output() const { return slurp(dir / "err.txt") + slurp(dir / "out.txt"); }

  pid_t pid_ = -1;
};

// OpenMPI's default: when a rank dies of a signal, mpirun kills the others and exits non-zero.
TEST_F(Failures, ARankKilledMidRunEndsTheJobWithinThirtySeconds) {
  launch({train(100000), train(100000)});
  ASSERT_TRUE(wait_steps(3)) << output();
  const pid_t rank1 = test::find_rank_pid(dir, 1);
  ASSERT_GT(rank1, 0) << "rank 1 not found";
  kill(rank1, SIGKILL);
  double seconds = 0;
  const int code = wait_job(kLimit, &seconds);
  ASSERT_NE(code, -1) << "the job still runs 30 s after rank 1 was killed";
  EXPECT_NE(code, 0) << output();
  EXPECT_NE(output().find("exited on signal 9"), std::string::npos) << output();
  RecordProperty("seconds_to_end", std::to_string(seconds));
}

// A rank that stops without dying (SIGSTOP: a hung host, a stuck file system) is not noticed by
// mpirun; the other rank's wait for its next collective times out (--collective-timeout) and
// its error ends the job.
TEST_F(Failures, ARankThatStopsEndsTheJobAfterTheCollectiveTimeout) {
  launch({train(100000, {"--collective-timeout", "3"}),
          train(100000, {"--collective-timeout", "3"})});
  ASSERT_TRUE(wait_steps(3)) << output();
  const pid_t rank1 = test::find_rank_pid(dir, 1);
  ASSERT_GT(rank1, 0) << "rank 1 not found";
  kill(rank1, SIGSTOP);
  const int code = wait_job(kLimit);
  if (code == -1) kill(rank1, SIGKILL);
  ASSERT_NE(code, -1) << "the job still runs 30 s after rank 1 stopped";
  EXPECT_NE(code, 0);
  EXPECT_NE(output().find("did not complete within 3 s"), std::string::npos) << output();
  EXPECT_NE(output().find("rank 0: "), std::string::npos) << output();
}

// An error on one rank alone (here its --init-from does not exist) ends every rank: without the
// abort, rank 0 would wait for it forever in its first collective, and it in MPI_Finalize.
TEST_F(Failures, AnErrorOnOneRankEndsEveryRank) {
  launch({train(50), train(50, {"--init-from", (dir / "missing").string()})});
  double seconds = 0;
  const int code = wait_job(kLimit, &seconds);
  ASSERT_NE(code, -1) << "the job still runs 30 s after rank 1 failed";
  EXPECT_EQ(code, 2) << output();
  EXPECT_NE(output().find("memfit: rank 1: "), std::string::npos) << output();
  EXPECT_NE(output().find("missing"), std::string::npos) << output();
}

// Ranks started with different options or data fail together before the first step, with one
// message naming the option (or the data) and both ranks' values, and exit 2.
TEST_F(Failures, RanksThatDisagreeFailBeforeTheFirstStepNamingTheDifference) {
  launch({train(5), train(5, {"--lr", "0.001"})});
  ASSERT_EQ(wait_job(kLimit), 2) << output();
  std::string out = output();
  EXPECT_NE(out.find("ranks disagree about --lr: rank 0 has 0.0006, rank 1 has 0.001"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("ranks disagree"), out.rfind("ranks disagree")) << "said more than once";
  EXPECT_FALSE(fs::exists(dir / "log.jsonl") && slurp(dir / "log.jsonl").find("loss") !=
                                                     std::string::npos)
      << "a step ran";

  // The same options over another copy of the data whose training shard is shorter.
  fs::create_directories(dir / "other");
  fs::copy_file(dir / "data" / "val_000000.bin", dir / "other" / "val_000000.bin");
  std::vector<uint16_t> tokens(3000, 7);
  io::write_token_shard(dir / "other" / "train_000000.bin", tokens);
  launch({train(5), train(5, {"--data", (dir / "other").string()})});
  ASSERT_EQ(wait_job(kLimit), 2) << output();
  out = output();
  EXPECT_NE(out.find(fmt::format("ranks disagree about the training data: rank 0 has "
                                 "train_000000.bin ({} bytes), rank 1 has train_000000.bin ({} "
                                 "bytes)",
                                 fs::file_size(dir / "data" / "train_000000.bin"),
                                 fs::file_size(dir / "other" / "train_000000.bin"))),
            std::string::npos)
      << out;

  // Whether the update runs inside the backward changes the collectives of every step.
  launch({train(5, {"--zero", "2"}), train(5, {"--zero", "2", "--update-in-backward"})});
  ASSERT_EQ(wait_job(kLimit), 2) << output();
  EXPECT_NE(output().find("ranks disagree about --update-in-backward"), std::string::npos)
      << output();

  // --tp makes the grid, whose splits every rank must make alike: agreed before them.
  launch({train(5), train(5, {"--tp", "2"})});
  ASSERT_EQ(wait_job(kLimit), 2) << output();
  EXPECT_NE(output().find("ranks disagree about --tp: rank 0 has 1, rank 1 has 2"),
            std::string::npos)
      << output();
}

// MEMFIT_CHECK_COLLECTIVES=1: a run whose ranks agree trains as usual (the check passes every
// collective of a step, the evaluation and the end of the run).
TEST_F(Failures, CheckingCollectivesPassesARunWhoseRanksAgree) {
  {
    const test::ScopedEnv check("MEMFIT_CHECK_COLLECTIVES", "1");
    launch({train(3, {"--eval-every", "2", "--eval-batches", "2"}),
            train(3, {"--eval-every", "2", "--eval-batches", "2"})});
  }
  ASSERT_EQ(wait_job(kLimit), 0) << output();
  EXPECT_NE(output().find("every collective checked"), std::string::npos) << output();
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

class RanksOptions : public test::BinaryTest {
 protected:
  RanksOptions() : BinaryTest(5) {}
  int run(const std::string& args) const {
    const std::string command = fmt::format("{}/memfit {} > '{}' 2> '{}'", MEMFIT_BINARY_DIR, args,
                                            (dir / "out.txt").string(), (dir / "err.txt").string());
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
};

// train takes its ranks from the launcher: --ranks / --world-size say how to start them.
TEST_F(RanksOptions, TrainWithRanksSaysHowToLaunchThem) {
  for (const char* option : {"--ranks", "--world-size"}) {
    EXPECT_EQ(run(fmt::format("train --model gpt2-tiny --steps 1 --data '{}' {} 2",
                              (dir / "data").string(), option)),
              2);
    const std::string err = slurp(dir / "err.txt");
    EXPECT_NE(err.find("memfit train starts no ranks itself: launch 2 ranks with `mpirun -n 2 "
                       "memfit train ...`"),
              std::string::npos)
        << err;
  }
  // plan takes both names.
  EXPECT_EQ(run(fmt::format("plan --model gpt2-tiny --batch 2 --world-size 2 --json --data '{}'",
                            (dir / "data").string())),
            0)
      << slurp(dir / "err.txt");
  EXPECT_NE(slurp(dir / "out.txt").find("\"ranks\": 2"), std::string::npos);
}

}  // namespace
}  // namespace memfit
