// The profiler: its output directory (per rank under MPI), its refusals (a file in the way, no
// steps), the window of --profile-steps, and the files written when it closes.
#include "memfit/profile/profiler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "memfit/core/error.h"
#include "memfit/kernels/kernel_times.h"
#include "profile_test_util.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class ProfilerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = fs::temp_directory_path() / fmt::format("memfit_profiler_{}_{}", ::getpid(),
                                                  ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir);
  }
  void TearDown() override { fs::remove_all(dir); }
  fs::path dir;
};

TEST_F(ProfilerTest, RefusesAFileInTheWayAndNoSteps) {
  MemoryPool pool;
  fs::create_directories(dir);
  std::ofstream(dir / "file") << "x";
  EXPECT_THROW(profile::Profiler({(dir / "file").string(), 3}, pool, std::chrono::steady_clock::now()),
               IoError);
  EXPECT_THROW(profile::Profiler({(dir / "p").string(), 0}, pool, std::chrono::steady_clock::now()),
               ConfigError);
}

TEST_F(ProfilerTest, UnderMpiEachRankHasItsDirectory) {
  MemoryPool pool;
  profile::Profiler p({dir.string(), 3, 1, 2}, pool, std::chrono::steady_clock::now());
  EXPECT_EQ(p.dir(), dir / "rank1");
  EXPECT_TRUE(fs::is_directory(dir / "rank1"));
}

TEST_F(ProfilerTest, WritesTheFilesWhenTheWindowCloses) {
  MemoryPool pool;
  profile::Profiler p({dir.string(), 2}, pool, std::chrono::steady_clock::now());
  Allocation slab = pool.allocate(1 << 20, Category::params, "params");
  p.set_run({{"title", "a <test>"}}, std::nullopt);
  { kernels::KernelScope before("before the window"); }
  p.step_begin(5);
  { kernels::KernelScope k("a kernel", 1e6); }
  EXPECT_FALSE(p.step_end(5));
  p.step_begin(6);
  { kernels::KernelScope k("a kernel", 1e6); }
  EXPECT_TRUE(p.step_end(6));
  { kernels::KernelScope after("after the window"); }
  EXPECT_FALSE(kernels::kernel_times_on());
  EXPECT_EQ(p.recorder(), nullptr);
  for (const char* f : {"trace.json", "memory.html", "summary.json"})
    EXPECT_TRUE(fs::exists(dir / f)) << f;
  // No temporary files left behind by the atomic writes.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 3);
  EXPECT_NE(p.text().find("memfit profile:"), std::string::npos);
  // The window's kernels, and only those (Note [Kernel times]).
  std::ifstream sj(dir / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(sj);
  ASSERT_EQ(summary["kernels"].size(), 1u) << summary["kernels"].dump();
  EXPECT_EQ(summary["kernels"][0]["name"], "a kernel");
  EXPECT_EQ(summary["kernels"][0]["calls"], 2);
  EXPECT_TRUE(summary["kernels"][0].contains("gflops_per_s"));
  EXPECT_NE(p.text().find("time in kernels"), std::string::npos) << p.text();
  std::ifstream html(dir / "memory.html");
  std::string page((std::istreambuf_iterator<char>(html)), std::istreambuf_iterator<char>());
  EXPECT_NE(page.find("<title>a &lt;test&gt;</title>"), std::string::npos);
  p.finish();  // nothing more
}

}  // namespace
}  // namespace memfit
