// plan/ plans a run from its typed description (plan/run_spec.h) and the model's own
// description; it must not reach into how a run is set up or trained (train/) or into the
// command line (cli/), so that the planner's input is one type and nothing else (STYLE.md,
// "Layout"). A new include that breaks this fails here, naming the file and the line.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

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

}  // namespace
}  // namespace memfit
