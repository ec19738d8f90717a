// The profiler: its output directory (per rank under MPI), its refusals (a file in the way, no
// steps), the window of --profile-steps, and the files written when it closes.
#include "memfit/profile/profiler.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "memfit/core/error.h"
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
  p.step_begin(5);
  EXPECT_FALSE(p.step_end(5));
  p.step_begin(6);
  EXPECT_TRUE(p.step_end(6));
  EXPECT_EQ(p.recorder(), nullptr);
  for (const char* f : {"trace.json", "memory.html", "summary.json"})
    EXPECT_TRUE(fs::exists(dir / f)) << f;
  // No temporary files left behind by the atomic writes.
  EXPECT_EQ(std::distance(fs::directory_iterator(dir), fs::directory_iterator()), 3);
  EXPECT_NE(p.text().find("memfit profile:"), std::string::npos);
  std::ifstream html(dir / "memory.html");
  std::string page((std::istreambuf_iterator<char>(html)), std::istreambuf_iterator<char>());
  EXPECT_NE(page.find("<title>a &lt;test&gt;</title>"), std::string::npos);
  p.finish();  // nothing more
}

}  // namespace
}  // namespace memfit
