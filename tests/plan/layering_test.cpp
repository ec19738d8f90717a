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

}  // namespace
}  // namespace memfit
