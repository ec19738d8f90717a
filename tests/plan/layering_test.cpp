// plan/ plans a run from its typed description (plan/run_spec.h) and the model's own
// description; it must not reach into how a run is set up or trained (train/) or into the
// command line (cli/), so that the planner's input is one type and nothing else (STYLE.md,
// "Layout"). A new include that breaks this fails here, naming the file and the line. And the
// whole tree: every folder includes only those below it in one written order.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

namespace memfit {
namespace {

namespace fs = std::filesystem;

TEST(Layering, PlanIncludesNothingFromTrainOrCli) {
  const fs::path plan = fs::path(MEMFIT_SOURCE_DIR) / "src" / "memfit" / "plan";
  ASSERT_TRUE(fs::is_directory(plan)) << plan;
  int files = 0;
  for (const auto& entry : fs::directory_iterator(plan)) {
    ++files;
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n) {
      for (const char* banned : {"\"memfit/train/", "\"memfit/cli/"}) {
        EXPECT_EQ(line.find(banned), std::string::npos)
            << entry.path().filename().string() << ":" << n << ": " << line;
      }
    }
  }
  EXPECT_GT(files, 10);  // the folder was read
}

// The model calls the state it does not hold through its own interfaces (model/grad_store.h,
// model/weight_source.h); the ZeRO services that implement them live in dist/zero/ (Note [State
// placement]). So model/ includes nothing from dist/.
TEST(Layering, ModelIncludesNothingFromDist) {
  const fs::path model = fs::path(MEMFIT_SOURCE_DIR) / "src" / "memfit" / "model";
  ASSERT_TRUE(fs::is_directory(model)) << model;
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(model)) {
    if (!entry.is_regular_file()) continue;
    ++files;
    std::ifstream in(entry.path());
    std::string line;
    for (int n = 1; std::getline(in, line); ++n)
      EXPECT_EQ(line.find("\"memfit/dist/"), std::string::npos)
          << entry.path().filename().string() << ":" << n << ": " << line;
  }
  EXPECT_GT(files, 20);  // the folder was read
}

// The folders of src/memfit/ in their one order, lowest first: a folder includes only itself and
// the folders before it, so dependencies go one way and nothing is a cycle (STYLE.md, "Decisions
// made once"). Written here once; docs/notes/architecture.md explains it. A new folder must be
// placed in it (the test fails on a folder it does not list).
const std::vector<std::string> kFolderOrder = {"core",  "memory", "kernels", "model", "optim",
                                               "state", "dist",   "io",      "offload", "plan",
                                               "profile", "train", "cli"};

TEST(Layering, EveryFolderIncludesOnlyFoldersBelowIt) {
  const fs::path src = fs::path(MEMFIT_SOURCE_DIR) / "src" / "memfit";
  auto rank = [](const std::string& folder) {
    return std::find(kFolderOrder.begin(), kFolderOrder.end(), folder) - kFolderOrder.begin();
  };
  const std::regex include(R"re(^\s*#\s*include\s*"memfit/([a-z_0-9]+)/)re");
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    if (!entry.is_regular_file()) continue;
    const std::string folder = fs::relative(entry.path(), src).begin()->string();
    ASSERT_LT(rank(folder), static_cast<long>(kFolderOrder.size()))
        << "src/memfit/" << folder << " is not in kFolderOrder (tests/plan/layering_test.cpp)";
    ++files;
    std::ifstream in(entry.path());
    std::string line;
    std::smatch m;
    for (int n = 1; std::getline(in, line); ++n) {
      if (!std::regex_search(line, m, include)) continue;
      const std::string to = m[1];
      EXPECT_LE(rank(to), rank(folder))
          << fs::relative(entry.path(), src).string() << ":" << n << ": " << folder
          << "/ may not include " << to << "/ (above it in kFolderOrder): " << line;
    }
  }
  EXPECT_GT(files, 300);  // the tree was read
}

}  // namespace
}  // namespace memfit
