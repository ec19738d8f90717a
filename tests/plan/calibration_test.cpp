// The calibration cache (plan/calibration.h): where it lives and what keys it, that a cached
// calibration is reused without measuring, that a damaged one is measured again with a message,
// and the log2 interpolation of GEMM rates between widths. No timed assertions: rates are only
// required to be positive.
#include "memfit/plan/calibration.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include <fmt/format.h>

#include "memfit/core/cpu.h"
#include "memfit/core/cpu_load.h"
#include "memfit/core/error.h"
#include "../support/scoped_env.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

// MEMFIT_CACHE_DIR pointed at a fresh folder for the scope, then restored.
class CacheDir {
 public:
  explicit CacheDir(const std::string& name)
      : path_(fresh(fs::temp_directory_path() /
                    fmt::format("memfit_calib_{}_{}", ::getpid(), name))),
        env_("MEMFIT_CACHE_DIR", path_.string()) {}
  ~CacheDir() { fs::remove_all(path_); }
  const fs::path& path() const { return path_; }
  // Unsets MEMFIT_CACHE_DIR until the scope ends.
  void unset() const { env_.set(nullptr); }

 private:
  static fs::path fresh(fs::path p) {
    fs::remove_all(p);
    return p;
  }
  fs::path path_;
  test::ScopedEnv env_;
};

// A calibration with made-up rates for this CPU, cap and thread count.
Calibration made_up(int threads) {
  Calibration c;
  c.cpu = cpu::identity();
  c.isa = std::string(cpu::isa_name(cpu::max_isa()));
  c.threads = threads;
  c.gemm = {{384, 1e11, 2e11, 3e11, 4e11}, {1536, 3e11, 4e11, 5e11, 6e11}};
  c.attention_f32 = 5e10;
  c.attention_bf16 = 6e10;
  c.elementwise_bytes_per_s = 1e10;
  c.stream_bytes_per_s = 2e10;
  c.copy_bytes_per_s = 1.5e10;
  return c;
}

std::string read_all(std::FILE* f) {
  std::rewind(f);
  std::string s;
  for (int ch; (ch = std::fgetc(f)) != EOF;) s += static_cast<char>(ch);
  return s;
}

TEST(CalibrationCache, LivesUnderMemfitCacheDirThenXdgThenHome) {
  CacheDir dir("where");
  EXPECT_EQ(calibration_cache_dir(), dir.path());
  dir.unset();
  const test::ScopedEnv xdg("XDG_CACHE_HOME", "/tmp/xdg");
  EXPECT_EQ(calibration_cache_dir(), fs::path("/tmp/xdg/memfit"));
  xdg.set(nullptr);
  if (const char* home = std::getenv("HOME")) {
    EXPECT_EQ(calibration_cache_dir(), fs::path(home) / ".cache" / "memfit");
  }
}

TEST(CalibrationCache, KeyedByCpuCapAndThreads) {
  CacheDir dir("key");
  const fs::path one = calibration_cache_path(1), two = calibration_cache_path(2);
  EXPECT_NE(one, two);
  EXPECT_EQ(one.parent_path(), dir.path());
  const std::string name = one.filename().string();
  EXPECT_NE(name.find(fmt::format("-{}-1t.json", cpu::isa_name(cpu::max_isa()))),
            std::string::npos)
      << name;  // another cap, another file (the binary's test runs one under the AVX2 cap)
  // A file measured elsewhere is refused by name.
  Calibration other = made_up(1);
  other.isa = "scalar-elsewhere";
  save_calibration(one, other);
  EXPECT_THROW(load_calibration(one, 1), IoError);
  save_calibration(one, made_up(2));
  EXPECT_THROW(load_calibration(one, 1), IoError);  // another thread count
}

TEST(CalibrationCache, ACachedCalibrationIsReusedWithoutMeasuring) {
  CacheDir dir("reuse");
  const int threads = omp_get_max_threads();
  save_calibration(calibration_cache_path(threads), made_up(threads));
  std::FILE* note = std::tmpfile();
  const Calibration& c = machine_calibration(note);
  EXPECT_EQ(read_all(note), "");  // nothing measured, nothing said
  std::fclose(note);
  EXPECT_EQ(c.elementwise_bytes_per_s, 1e10);
  EXPECT_EQ(&machine_calibration(nullptr), &c);  // remembered in the process
  const Calibration back = load_calibration(calibration_cache_path(threads), threads);
  EXPECT_EQ(back.to_json(), made_up(threads).to_json());
}

TEST(CalibrationCache, ADamagedFileIsMeasuredAgainWithAMessage) {
  // The cache is derived data: a damaged file is replaced (saying why), not an error to fix.
  CacheDir dir("corrupt");
  const int threads = omp_get_max_threads();
  const fs::path path = calibration_cache_path(threads);
  fs::create_directories(path.parent_path());
  std::ofstream(path) << "{\"version\": 1, \"cpu\": ";  // cut short
  EXPECT_THROW(load_calibration(path, threads), IoError);
  std::FILE* note = std::tmpfile();
  const Calibration& c = machine_calibration(note);
  const std::string said = read_all(note);
  std::fclose(note);
  EXPECT_NE(said.find("calibrating"), std::string::npos) << said;
  EXPECT_NE(said.find("unusable"), std::string::npos) << said;
  EXPECT_NE(said.find(path.string()), std::string::npos) << said;
  EXPECT_EQ(c.threads, threads);
  EXPECT_GT(c.elementwise_bytes_per_s, 0);
  EXPECT_GT(c.stream_bytes_per_s, 0);
  EXPECT_GT(c.copy_bytes_per_s, 0);
  EXPECT_GT(c.attention_f32, 0);
  EXPECT_GT(c.attention_bf16, 0);
  ASSERT_EQ(c.gemm.size(), 3u);
  for (const GemmRates& g : c.gemm) {
    EXPECT_GT(g.f32_block, 0);
    EXPECT_GT(g.bf16_head, 0);
  }
  // The file now holds the new measurement.
  EXPECT_EQ(load_calibration(path, threads).to_json(), c.to_json());
}

TEST(CalibrationCache, ABusyCalibrationIsKeptWhileTheMachineIsBusy) {
  // Measured while other work kept every CPU busy; child processes spin on every CPU while the
  // planner looks, so the machine is busy now too: the cached rates are used, nothing is
  // measured (a machine that is always busy would otherwise calibrate on every run). One
  // spinner is not enough on many cores: with 16 threads on 16 CPUs it is 1 busy CPU against
  // the 1.6 that cpu::load_disturbs tolerates.
  CacheDir dir("busy");
  const int threads = omp_get_max_threads();
  Calibration busy = made_up(threads);
  busy.other_cpus = cpu::online_cpus();
  ASSERT_TRUE(busy.busy());
  save_calibration(calibration_cache_path(threads), busy);
  std::vector<pid_t> children;
  for (int i = 0; i < cpu::online_cpus(); ++i) {
    const pid_t child = ::fork();
    if (child == 0)
      for (volatile unsigned long k = 0;;) k = k + 1;
    if (child > 0) children.push_back(child);
  }
  std::FILE* note = std::tmpfile();
  const Calibration& c = machine_calibration(note);
  for (pid_t child : children) {
    ::kill(child, SIGKILL);
    ::waitpid(child, nullptr, 0);
  }
  ASSERT_EQ(children.size(), static_cast<size_t>(cpu::online_cpus())) << "fork failed";
  EXPECT_EQ(read_all(note), "");
  std::fclose(note);
  EXPECT_EQ(c.to_json(), busy.to_json());
}

TEST(Calibration, ABusyOneIsMeasuredAgainOnceTheMachineIsQuiet) {
  const int n = cpu::online_cpus();
  Calibration c = made_up(n);
  EXPECT_FALSE(c.busy());
  const double old = kBusyCalibrationKeptSeconds;
  EXPECT_FALSE(calibration_remeasure(c, 0.0, old));  // quiet when measured: kept
  EXPECT_FALSE(calibration_remeasure(c, n, old));
  c.other_cpus = 0.5 * n;  // half the machine taken while it measured
  EXPECT_TRUE(c.busy());
  EXPECT_TRUE(calibration_remeasure(c, 0.0, old));
  EXPECT_TRUE(calibration_remeasure(c, 0.05 * n, old));
  EXPECT_FALSE(calibration_remeasure(c, 0.5 * n, old));  // still busy: kept
  // Measured minutes ago: kept even on a quiet machine (a machine busy in bursts would
  // otherwise measure at each quiet moment, beside the next burst).
  EXPECT_FALSE(calibration_remeasure(c, 0.0, old - 1));
  EXPECT_FALSE(calibration_remeasure(c, 0.0, 0));
  // The count travels with the file.
  EXPECT_EQ(Calibration::from_json(c.to_json(), "x").other_cpus, 0.5 * n);
  nlohmann::json before = c.to_json();  // a file from before it was recorded: quiet
  before.erase("other_cpus");
  EXPECT_FALSE(Calibration::from_json(before, "x").busy());
}

// Processes that find the cache unusable at once (the ranks of an mpirun job) measure one at a
// time: the first measures and saves, the others wait on its lock and take its file. Three
// processes released together, each measurement taking 300 ms: one measurement in all, and
// every process has its rates; then an unusable file is measured again by the next process.
TEST(CalibrationCache, ProcessesFindingItMissingTogetherMeasureOnce) {
  CacheDir dir("once");
  const int threads = omp_get_max_threads();
  const fs::path path = calibration_cache_path(threads), count = dir.path() / "measured";
  int go[2];
  ASSERT_EQ(::pipe(go), 0);
  std::vector<pid_t> children;
  for (int i = 0; i < 3; ++i) {
    const pid_t child = ::fork();
    if (child == 0) {
      ::close(go[1]);
      char c;
      if (::read(go[0], &c, 1) < 0) ::_exit(3);  // released when the parent closes its end
      const Calibration got = measure_once(path, threads, [&] {
        std::ofstream(count, std::ios::app) << "measured\n";
        ::usleep(300000);
        return made_up(threads);
      });
      ::_exit(got.to_json() == made_up(threads).to_json() ? 0 : 2);
    }
    ASSERT_GT(child, 0) << "fork failed";
    children.push_back(child);
  }
  ::close(go[0]);
  ::close(go[1]);
  for (pid_t child : children) {
    int status = 0;
    ASSERT_EQ(::waitpid(child, &status, 0), child);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  std::ifstream in(count);
  int lines = 0;
  for (std::string line; std::getline(in, line);) ++lines;
  EXPECT_EQ(lines, 1);
  EXPECT_EQ(load_calibration(path, threads).to_json(), made_up(threads).to_json());
  // Nobody measuring now: the next process measures (its own measurement saved).
  Calibration other = made_up(threads);
  other.elementwise_bytes_per_s = 7e9;
  EXPECT_EQ(measure_once(path, threads, [&] { return other; }).elementwise_bytes_per_s, 7e9);
  EXPECT_EQ(load_calibration(path, threads).elementwise_bytes_per_s, 7e9);
}

TEST(CalibrationCache, MissingFieldsAndNonPositiveRatesAreRefused) {
  nlohmann::json j = made_up(1).to_json();
  EXPECT_NO_THROW(Calibration::from_json(j, "x"));
  nlohmann::json missing = j;
  missing.erase("stream_bytes_per_s");
  EXPECT_THROW(Calibration::from_json(missing, "x"), IoError);
  nlohmann::json no_copy = j;  // a version-3 file's fields: no transport rate
  no_copy.erase("copy_bytes_per_s");
  EXPECT_THROW(Calibration::from_json(no_copy, "x"), IoError);
  nlohmann::json zero = j;
  zero["gemm_flops_per_s"][0]["f32_block"] = 0.0;
  EXPECT_THROW(Calibration::from_json(zero, "x"), IoError);
  nlohmann::json old = j;
  old["version"] = 0;
  try {
    Calibration::from_json(old, "x");
    ADD_FAILURE() << "an old format was read";
  } catch (const IoError& e) {  // a cache left by an older memfit: said as such
    EXPECT_NE(std::string(e.what()).find("x: written by another version of memfit (format 0"),
              std::string::npos)
        << e.what();
  }
}

TEST(Calibration, RatesInterpolateInLog2OfTheWidth) {
  const Calibration c = made_up(1);
  EXPECT_DOUBLE_EQ(c.block_rate(false, 384), 1e11);
  EXPECT_DOUBLE_EQ(c.block_rate(false, 100), 1e11);    // below: the first
  EXPECT_DOUBLE_EQ(c.block_rate(false, 6400), 3e11);   // above: the last
  EXPECT_DOUBLE_EQ(c.block_rate(false, 768), 2e11);    // halfway in log2 between 384 and 1536
  EXPECT_DOUBLE_EQ(c.head_rate(true, 768), 5e11);
}

}  // namespace
}  // namespace memfit
