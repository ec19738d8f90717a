// Preemption through the built binary, with real signals to a real process: SIGTERM and SIGINT
// stop `memfit train` after the step in progress, save it and exit 143 / 130 with a line on how
// to resume; a second signal exits at once and leaves the last checkpoint loadable; a resume cuts
// the JSON-lines log back to the checkpoint's step so that every step appears once, even after
// a kill -9; a kill -9 of one rank of a --tp run mid-save leaves a complete checkpoint.
#include <gtest/gtest.h>
#include <signal.h>
#include <spawn.h>

#include <algorithm>
#include <sys/wait.h>
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli_test_util.h"
#include "memfit/io/checkpoint/checkpoint_dir.h"
#include "../support/scoped_env.h"

extern char** environ;

namespace memfit {
namespace {

namespace fs = std::filesystem;
using namespace std::chrono_literals;

using test::slurp;

class Interrupt : public test::BinaryTest {
 protected:
  Interrupt() : BinaryTest(7) {}

  // kill -9 during an offloaded run (with `more` options), then a resume: the body of the
  // offload tests below. `min_files`: the scratch files the killed run leaves.
  void kill_offloaded_run_and_resume(const std::vector<std::string>& more, int min_files);

  // `memfit train` on gpt2-tiny, long enough to be interrupted; extra options appended.
  std::vector<std::string> train_args(int steps, const std::vector<std::string>& extra) const {
    std::vector<std::string> a = {(fs::path(MEMFIT_BINARY_DIR) / "memfit").string(),
                                  "train", "--model", "gpt2-tiny", "--seq-len", "32",
                                  "--batch", "4", "--threads", "1", "--steps",
                                  std::to_string(steps), "--data", (dir / "data").string(),
                                  "--save", (dir / "ck").string(), "--log",
                                  (dir / "log.jsonl").string(), "--eval-every", "0"};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  // Starts a process with stdout and stderr to files in dir; returns its pid.
  pid_t spawn(const std::vector<std::string>& args) const {
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    const std::string out = (dir / "out.txt").string(), err = (dir / "err.txt").string();
    posix_spawn_file_actions_addopen(&fa, 1, out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_addopen(&fa, 2, err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    std::vector<char*> argv;
    for (const auto& s : args) argv.push_back(const_cast<char*>(s.c_str()));
    argv.push_back(nullptr);
    pid_t pid = -1;
    EXPECT_EQ(posix_spawn(&pid, argv[0], &fa, nullptr, argv.data(), environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    return pid;
  }
  // spawn() for mpirun: OpenMPI's own allocations at exit are not memfit's, so no leak report
  // in the sanitizer build.
  pid_t spawn_without_leak_check(const std::vector<std::string>& args) const {
    const test::ScopedEnv asan("ASAN_OPTIONS", "detect_leaks=0");
    return spawn(args);
  }
  // The exit code, or 128 + the signal that killed it.
  static int wait_exit(pid_t pid) {
    int status = 0;
    waitpid(pid, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  // Lines of the log; waits until it has at least `n` training lines (60 s at most).
  std::vector<nlohmann::json> log_lines() const {
    std::vector<nlohmann::json> lines;
    std::ifstream in(dir / "log.jsonl");
    for (std::string l; std::getline(in, l);) {
      auto j = nlohmann::json::parse(l, nullptr, false);
      if (!j.is_discarded()) lines.push_back(j);
    }
    return lines;
  }
  bool wait_for(const std::function<bool()>& ready) const {
    for (auto until = std::chrono::steady_clock::now() + 60s;
         std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(20ms))
      if (ready()) return true;
    return false;
  }
  int64_t saved_step() const {
    const fs::path state = dir / "ck" / "trainer_state.json";
    if (!fs::exists(state)) return -1;
    auto j = nlohmann::json::parse(slurp(state), nullptr, false);
    return j.is_discarded() ? -1 : j["step"].get<int64_t>();
  }
  // Every training line's step, in order.
  std::vector<int64_t> logged_steps() const {
    std::vector<int64_t> steps;
    for (const auto& j : log_lines())
      if (j.contains("loss")) steps.push_back(j["step"].get<int64_t>());
    return steps;
  }

};

// SIGTERM and SIGINT: the step in progress finishes, is saved, and the exit code is the shell's.
TEST_F(Interrupt, ASignalSavesTheStepAndExitsWithItsCode) {
  for (auto [sig, code] : {std::pair{SIGTERM, 143}, std::pair{SIGINT, 130}}) {
    SCOPED_TRACE(code);
    fs::remove_all(dir / "ck");
    fs::remove(dir / "log.jsonl");
    const pid_t pid = spawn(train_args(100000, {}));
    ASSERT_TRUE(wait_for([&] { return logged_steps().size() >= 3; })) << slurp(dir / "err.txt");
    kill(pid, sig);
    EXPECT_EQ(wait_exit(pid), code) << slurp(dir / "err.txt");
    const std::string err = slurp(dir / "err.txt");
    EXPECT_NE(err.find(sig == SIGTERM ? "stopped by SIGTERM" : "stopped by SIGINT"),
              std::string::npos)
        << err;
    EXPECT_NE(err.find("--resume"), std::string::npos) << err;
    // The checkpoint holds the last logged step, and the summary was printed.
    const std::vector<int64_t> steps = logged_steps();
    ASSERT_FALSE(steps.empty());
    EXPECT_EQ(saved_step(), steps.back());
    EXPECT_NE(slurp(dir / "out.txt").find("peak memory"), std::string::npos);
  }
}

// A second signal exits at once: the checkpoint of --save-every (or the one being written, if
// its swap completed) is intact, and a resume from it runs.
TEST_F(Interrupt, ASecondSignalExitsAtOnceAndTheLastCheckpointLoads) {
  const pid_t pid = spawn(train_args(100000, {"--save-every", "1"}));
  ASSERT_TRUE(wait_for([&] { return saved_step() >= 2; })) << slurp(dir / "err.txt");
  // Two different signals (two of one kind may merge while pending), delivered in either order:
  // the exit code is 128 + whichever came second, and the graceful path's "stopped by" line
  // (printed after its save) never appears.
  kill(pid, SIGINT);
  kill(pid, SIGTERM);
  const int code = wait_exit(pid);
  EXPECT_TRUE(code == 130 || code == 143) << code;
  EXPECT_EQ(slurp(dir / "err.txt").find("stopped by"), std::string::npos) << slurp(dir / "err.txt");
  const pid_t resumed =
      spawn(train_args(100000, {"--save-every", "1", "--resume", (dir / "ck").string()}));
  ASSERT_TRUE(wait_for([&] { return logged_steps().size() >= 2 && saved_step() > 0; }));
  kill(resumed, SIGINT);
  EXPECT_EQ(wait_exit(resumed), 130) << slurp(dir / "err.txt");
}

// kill -9 after a checkpoint and a few more steps, then resume: the log's lines after the
// checkpoint are cut before it appends, so steps 1..N each appear exactly once.
TEST_F(Interrupt, AResumeCutsTheLogBackSoEveryStepAppearsOnce) {
  const pid_t pid = spawn(train_args(100000, {"--save-every", "5"}));
  // Kill it with steps in the log past its checkpoint: freeze it (SIGSTOP) where the log is
  // ahead of the checkpoint, else let it go on and try again (it may have just saved).
  auto ahead = [&] {
    const int64_t saved = saved_step();
    return saved >= 5 && static_cast<int64_t>(logged_steps().size()) > saved;
  };
  for (int attempt = 0;; ++attempt) {
    ASSERT_LT(attempt, 50) << "the log never got ahead of the checkpoint";
    ASSERT_TRUE(wait_for([&] { return ahead() && logged_steps().size() >= 8; }));
    kill(pid, SIGSTOP);
    if (ahead()) break;
    kill(pid, SIGCONT);
  }
  kill(pid, SIGKILL);
  EXPECT_EQ(wait_exit(pid), 128 + SIGKILL);
  const int64_t resumed_from = saved_step();
  const int64_t before = static_cast<int64_t>(logged_steps().size());
  ASSERT_GT(before, resumed_from);  // steps past the checkpoint are in the log
  const int64_t total = before + 4;
  const pid_t resumed = spawn(train_args(100000, {"--save-every", "5", "--resume",
                                                  (dir / "ck").string(), "--stop-after",
                                                  std::to_string(total)}));
  EXPECT_EQ(wait_exit(resumed), 0) << slurp(dir / "err.txt");
  std::vector<int64_t> want(total);
  for (int64_t i = 0; i < total; ++i) want[i] = i + 1;
  EXPECT_EQ(logged_steps(), want);
}

// kill -9 in the middle of a run whose optimizer state and master weights are on disk (Note
// [NVMe offload]): the last checkpoint is whole (the offload files are scratch, never part of
// it), the files left behind name their run in their header, and a resume from the checkpoint
// ends with exactly the checkpoint of the run that was never killed.
// With --offload-params nvme the blocks' working weights are a scratch file too (Note [NVMe
// offload], "Working weights on disk"), left behind with the others and never read again.
TEST_F(Interrupt, KillDuringAnOffloadedRunResumesBitIdentically) {
  kill_offloaded_run_and_resume({}, 5);  // master, and each 8-bit moment's codes and absmax
}

TEST_F(Interrupt, KillWithTheWorkingWeightsOffloadedResumesBitIdentically) {
  kill_offloaded_run_and_resume({"--offload-params", "nvme"}, 6);  // and the params file
}

// The same with the gradients on disk too (Note [NVMe offload], "Gradients on disk"), and the
// working weights: every offload file is scratch, and the checkpoint never needs the
// gradients' file.
TEST_F(Interrupt, KillWithTheGradientsOffloadedResumesBitIdentically) {
  kill_offloaded_run_and_resume(
      {"--offload-grads", "nvme", "--offload-params", "nvme", "--grad-accum", "2"}, 7);
}

// Everything on disk in pure bf16 (the 7B headline's configuration): the working
// weights are the weights of record, and every save streams model.safetensors from their file
// (Note [Streamed save]); the resume from a save of a killed run is the uninterrupted run's.
TEST_F(Interrupt, KillWithEverythingOffloadedInPureBf16ResumesBitIdentically) {
  // Each 8-bit moment's codes and absmax, the params file and the gradients' file.
  kill_offloaded_run_and_resume({"--offload-grads", "nvme", "--offload-params", "nvme",
                                 "--master-weights", "none", "--grad-accum", "2"},
                                6);
}

void Interrupt::kill_offloaded_run_and_resume(const std::vector<std::string>& more,
                                              int min_files) {
  std::vector<std::string> offload = {"--offload-optimizer", "nvme", "--offload-dir",
                                      (dir / "off").string(), "--precision", "bf16",
                                      "--optim", "adamw8bit"};
  offload.insert(offload.end(), more.begin(), more.end());
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.end(), offload.begin(), offload.end());
    return extra;
  };
  const int steps = 40;
  ASSERT_EQ(wait_exit(spawn(train_args(steps, with({})))), 0) << slurp(dir / "err.txt");
  fs::rename(dir / "ck", dir / "reference");
  fs::remove(dir / "log.jsonl");
  const pid_t pid = spawn(train_args(steps, with({"--save-every", "3"})));
  ASSERT_TRUE(wait_for([&] { return saved_step() >= 6; })) << slurp(dir / "err.txt");
  kill(pid, SIGKILL);
  // The kill comes at step 6 of 40, polled every few milliseconds: any other end (a crash, an
  // abort, an error exit, or all 34 steps in one poll) fails here rather than skipping.
  ASSERT_EQ(wait_exit(pid), 128 + SIGKILL) << slurp(dir / "err.txt");
  const int64_t saved = saved_step();
  ASSERT_GE(saved, 6);
  // Its scratch files are still there (nothing ran its destructors), headers naming the run.
  int leftovers = 0;
  for (const auto& e : fs::directory_iterator(dir / "off")) {
    std::ifstream in(e.path());
    std::string header;
    std::getline(in, header);
    const auto j = nlohmann::json::parse(header, nullptr, false);
    ASSERT_FALSE(j.is_discarded()) << e.path();
    EXPECT_EQ(j["run"].get<std::string>().rfind(fmt::format("memfit-{}-", pid), 0), 0u) << header;
    ++leftovers;
  }
  EXPECT_GE(leftovers, min_files);
  const pid_t resumed = spawn(train_args(steps, with({"--save-every", "3", "--resume",
                                                      (dir / "ck").string()})));
  ASSERT_EQ(wait_exit(resumed), 0) << slurp(dir / "err.txt");
  for (const char* f : {"model.safetensors", "optimizer.safetensors"})
    EXPECT_TRUE(slurp(dir / "ck" / f) == slurp(dir / "reference" / f)) << f;
}

// Under mpirun, a signal to one rank stops every rank after the same step (they agree on it each
// step), and rank 0 saves that step. Rank 1 alone is signalled: without the agreement it would
// exit alone, mpirun would then kill rank 0 before any save, and no checkpoint would exist. At
// ZeRO stage 2 (bf16, sharded master weights) the save is the sharded one: every rank's shard
// file and the index, of the same step, and a resume from it runs.
TEST_F(Interrupt, UnderMpiASignalToOneRankStopsEveryRankAtTheSameStep) {
  if (std::string(MEMFIT_MPIEXEC).empty()) GTEST_SKIP() << "memfit was built without MPI";
  for (const bool zero : {false, true}) {
    SCOPED_TRACE(zero ? "--zero 2" : "--zero 0");
    fs::remove_all(dir / "ck");
    fs::remove(dir / "log.jsonl");
    const std::vector<std::string> extra =
        zero ? std::vector<std::string>{"--zero", "2", "--precision", "bf16"}
             : std::vector<std::string>{};
    std::vector<std::string> args = {MEMFIT_MPIEXEC, "-n", "2", "--allow-run-as-root",
                                     "--oversubscribe"};
    for (const std::string& a : train_args(100000, extra)) args.push_back(a);
    const pid_t mpirun = spawn_without_leak_check(args);
    if (!wait_for([&] { return logged_steps().size() >= 3; })) {
      kill(mpirun, SIGKILL);
      wait_exit(mpirun);
      FAIL() << "no progress: " << slurp(dir / "err.txt") << slurp(dir / "out.txt");
    }
    // Rank 1: the memfit process of this test that OpenMPI made rank 1.
    const pid_t rank = test::find_rank_pid(dir, 1);
    ASSERT_GT(rank, 0) << "rank 1 not found";
    kill(rank, SIGTERM);
    bool exited = wait_for([&] {
      int status = 0;
      return waitpid(mpirun, &status, WNOHANG) == mpirun;
    });
    if (!exited) {
      kill(mpirun, SIGKILL);
      wait_exit(mpirun);
    }
    ASSERT_TRUE(exited) << "the ranks did not stop together";
    const std::vector<int64_t> steps = logged_steps();
    ASSERT_FALSE(steps.empty());
    for (size_t i = 0; i < steps.size(); ++i) EXPECT_EQ(steps[i], int64_t(i + 1));
    EXPECT_EQ(saved_step(), steps.back()) << slurp(dir / "err.txt");
    if (!zero) continue;
    for (const char* f : {"zero-rank-00000-of-00002.safetensors",
                          "zero-rank-00001-of-00002.safetensors", "zero_shards.json"})
      EXPECT_TRUE(fs::exists(dir / "ck" / f)) << f;
    const auto index = nlohmann::json::parse(slurp(dir / "ck" / "zero_shards.json"));
    EXPECT_EQ(index["steps_taken"].get<int64_t>(), steps.back());
    // It resumes (two more steps) under mpirun at the same stage.
    std::vector<std::string> more = extra;
    for (const std::string& a : {std::string("--resume"), (dir / "ck").string(),
                                 std::string("--stop-after"), std::to_string(steps.back() + 2)})
      more.push_back(a);
    args.resize(5);
    for (const std::string& a : train_args(100000, more)) args.push_back(a);
    const pid_t resumed = spawn_without_leak_check(args);
    EXPECT_EQ(wait_exit(resumed), 0) << slurp(dir / "err.txt");
    EXPECT_EQ(saved_step(), steps.back() + 2);
  }
}

// kill -9 of one rank of a --tp 2 run that saves every step, caught while a save is staged (its
// ranks writing their slices beside the checkpoint): the job ends, and the checkpoint left is a
// complete one, from which one process (another layout) resumes (Note [Checkpoints across
// layouts]).
TEST_F(Interrupt, UnderTpAKillMidSaveLeavesTheLastCheckpoint) {
  if (std::string(MEMFIT_MPIEXEC).empty()) GTEST_SKIP() << "memfit was built without MPI";
  std::vector<std::string> args = {MEMFIT_MPIEXEC, "-n", "2", "--allow-run-as-root",
                                   "--oversubscribe"};
  for (const std::string& a : train_args(100000, {"--tp", "2", "--save-every", "1"}))
    args.push_back(a);
  const pid_t mpirun = spawn_without_leak_check(args);
  const fs::path staging = fs::path(dir / "ck").concat(".zero-staging");
  bool caught = false;
  for (auto until = std::chrono::steady_clock::now() + 60s;
       !caught && std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(1ms))
    caught = saved_step() >= 2 && fs::exists(staging);
  const pid_t rank = caught ? test::find_rank_pid(dir, 1) : -1;
  if (rank > 0) kill(rank, SIGKILL);
  const bool exited = wait_for([&] {
    int status = 0;
    return waitpid(mpirun, &status, WNOHANG) == mpirun;
  });
  if (!exited) {
    kill(mpirun, SIGKILL);
    wait_exit(mpirun);
  }
  ASSERT_TRUE(caught) << "no save seen in progress: " << slurp(dir / "err.txt");
  ASSERT_GT(rank, 0) << "rank 1 not found";
  EXPECT_TRUE(exited) << "the job did not end after a rank was killed";
  const io::CheckpointLocation at = io::locate_checkpoint(dir / "ck");
  const int64_t step =
      nlohmann::json::parse(slurp(at.dir / "trainer_state.json"))["step"].get<int64_t>();
  EXPECT_GE(step, 2);
  const pid_t resumed = spawn(train_args(100000, {"--resume", (dir / "ck").string(),
                                                  "--stop-after", std::to_string(step + 1)}));
  EXPECT_EQ(wait_exit(resumed), 0) << slurp(dir / "err.txt");
  EXPECT_EQ(saved_step(), step + 1);
}

}  // namespace
}  // namespace memfit
