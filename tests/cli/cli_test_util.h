// What the tests of the memfit binary share: a scratch directory per test holding small random
// train and val shards (tokens below 500, for gpt2-tiny), and reading a whole output file.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "memfit/io/data/token_shard.h"

namespace memfit::test {

inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The pid of the memfit process whose command line names `dir` and whose environment OpenMPI gave
// OMPI_COMM_WORLD_RANK=`rank`; -1 when there is none.
inline pid_t find_rank_pid(const std::filesystem::path& dir, int rank) {
  namespace fs = std::filesystem;
  const std::string nul(1, '\0');
  const std::string binary = (fs::path(MEMFIT_BINARY_DIR) / "memfit").string();
  const std::string want = nul + "OMPI_COMM_WORLD_RANK=" + std::to_string(rank) + nul;
  for (const auto& entry : fs::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = slurp(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.rfind(binary, 0) == 0 && cmdline.find(dir.string()) != std::string::npos &&
        (nul + slurp(entry.path() / "environ")).find(want) != std::string::npos)
      return static_cast<pid_t>(std::stoi(name));
  }
  return -1;
}

// What one memfit command did: its exit code and its standard output and error.
struct Output {
  int exit_code;
  std::string out, err;
  bool says(const std::string& text) const { return err.find(text) != std::string::npos; }
};

// SetUp skips when the binary is not built, else makes `dir` with data/ shards from `seed`.
class BinaryTest : public ::testing::Test {
 protected:
  explicit BinaryTest(uint32_t seed) : seed_(seed) {}
  void SetUp() override {
    namespace fs = std::filesystem;
    if (!fs::exists(fs::path(MEMFIT_BINARY_DIR) / "memfit")) GTEST_SKIP() << "memfit not built";
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir = fs::temp_directory_path() /
          fmt::format("memfit_cli_{}_{}_{}", ::getpid(), info->test_suite_name(), info->name());
    fs::remove_all(dir);
    fs::create_directories(dir / "data");
    std::vector<uint16_t> train(4000), val(800);
    uint32_t x = seed_;
    for (auto& t : train) t = static_cast<uint16_t>((x = x * 1103515245u + 12345u) >> 16) % 500;
    for (auto& t : val) t = static_cast<uint16_t>((x = x * 1103515245u + 12345u) >> 16) % 500;
    io::write_token_shard(dir / "data" / "train_000000.bin", train);
    io::write_token_shard(dir / "data" / "val_000000.bin", val);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }

  // Runs `memfit args` alone (ranks 0) or under mpirun with `ranks` ranks, with `env`'s
  // assignments ("NAME=value ...") before the command, its output in dir/out.txt and
  // dir/err.txt; returns the exit code (-1 when it did not exit).
  int run_memfit(const std::string& args, int ranks = 0, const std::string& env = "") const {
    // OpenMPI's own allocations at exit are not memfit's: no leak report in the sanitizer build.
    // Jobs of several ranks run one at a time (util-linux's flock on a file in the build tree):
    // CTest runs as many tests as there are cores, and a rank waiting for a message polls
    // (OpenMPI yields between polls when oversubscribed, but keeps its share of a core), so two
    // jobs of four ranks on two cores took each other's cores: the suite's multi-rank tests
    // took 5-7 times their time alone (PipelineInterleaved.TwoDataRanksMatchDataParallelism
    // 88.6 s in CI against 12.7 alone, session 35). One process takes the lock shared: such
    // runs go side by side, never beside a job of ranks. A test waiting here sleeps.
    const std::string lock = fmt::format("flock {}'{}/mpi-jobs.lock' ", ranks ? "" : "--shared ",
                                         MEMFIT_BINARY_DIR);
    // OpenMPI's shared-memory transport and ob1 chosen outright, and PMIx's plain key store:
    // otherwise each job's start probes UCX, the network transports and a shared-memory store,
    // a job of four ranks that trains two steps took 1.14 s against 0.82 s (medians of 7,
    // session 36); the tests run hundreds.
    const std::string launcher =
        ranks ? fmt::format("ASAN_OPTIONS=detect_leaks=0 OMPI_MCA_pml=ob1 "
                            "OMPI_MCA_btl=self,vader PMIX_MCA_gds=hash {}{} -n {} "
                            "--allow-run-as-root --oversubscribe ",
                            lock, MEMFIT_MPIEXEC, ranks)
              : lock;
    const std::string command =
        fmt::format("{} {}{}/memfit {} > '{}' 2> '{}'", env, launcher, MEMFIT_BINARY_DIR, args,
                    (dir / "out.txt").string(), (dir / "err.txt").string());
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }

  // run_memfit(args, 0, env) alone, with what it printed.
  Output memfit(const std::string& args, const std::string& env = "") const {
    const int code = run_memfit(args, 0, env);
    return {code, slurp(dir / "out.txt"), slurp(dir / "err.txt")};
  }

  std::filesystem::path dir;

 private:
  uint32_t seed_;
};

// A BinaryTest that runs memfit under mpirun: skipped where memfit was built without MPI.
class MpiBinaryTest : public BinaryTest {
 protected:
  using BinaryTest::BinaryTest;
  void SetUp() override {
    if (std::string(MEMFIT_MPIEXEC).empty()) GTEST_SKIP() << "memfit was built without MPI";
    BinaryTest::SetUp();
  }
};

}  // namespace memfit::test
