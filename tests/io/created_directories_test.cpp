// io::CreatedDirectories: what a run makes for its output goes again when the run ends, if
// empty; two processes sharing one parent (the ranks' rank-<r> subdirectories of one
// --offload-dir) leave it behind with create() alone when the one that made it ends first, and
// remove it with adopt() whichever ends last.
#include "memfit/io/created_directories.h"

#include <unistd.h>

#include <filesystem>
#include <optional>
#include <string>

#include <gtest/gtest.h>

namespace memfit::io {
namespace {

namespace fs = std::filesystem;

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() /
                     ("memfit_created_dirs_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  return d;
}

TEST(CreatedDirectories, MissingListsOutermostFirstAndNothingWhereTheDirectoryExists) {
  const fs::path base = fresh_dir("missing");
  EXPECT_EQ(CreatedDirectories::missing(base / "a" / "b"),
            (std::vector<fs::path>{base, base / "a", base / "a" / "b"}));
  fs::create_directories(base / "a");
  EXPECT_EQ(CreatedDirectories::missing(base / "a" / "b"),
            (std::vector<fs::path>{base / "a" / "b"}));
  EXPECT_TRUE(CreatedDirectories::missing(base / "a").empty());
  fs::remove_all(base);
}

// Two "ranks" (two objects) each making parent/rank-<r>; the one that made the parent ends first.
TEST(CreatedDirectories, TheSharedParentGoesWithWhicheverEndsLastOnlyWhenAdopted) {
  for (bool adopt : {false, true}) {
    const fs::path parent = fresh_dir(adopt ? "adopt" : "plain");
    const std::vector<fs::path> missing0 = CreatedDirectories::missing(parent / "rank-0");
    const std::vector<fs::path> missing1 = CreatedDirectories::missing(parent / "rank-1");
    std::optional<CreatedDirectories> rank0(std::in_place), rank1(std::in_place);
    rank0->create(parent / "rank-0", "test", "rank 0");  // makes the parent
    rank1->create(parent / "rank-1", "test", "rank 1");  // finds it made
    if (adopt) {
      rank0->adopt(missing0);
      rank1->adopt(missing1);
    }
    rank0.reset();  // ends first: its own directory goes, the parent holds rank-1
    EXPECT_FALSE(fs::exists(parent / "rank-0"));
    EXPECT_TRUE(fs::exists(parent / "rank-1"));
    rank1.reset();
    EXPECT_FALSE(fs::exists(parent / "rank-1"));
    EXPECT_EQ(fs::exists(parent), !adopt) << (adopt ? "adopted" : "create alone");
    fs::remove_all(parent);
  }
}

// A directory that holds anything stays, and so do its ancestors.
TEST(CreatedDirectories, ADirectoryThatHoldsSomethingStays) {
  const fs::path base = fresh_dir("holds");
  {
    CreatedDirectories made;
    made.create(base / "out", "test", "out");
    made.adopt(CreatedDirectories::missing(base / "out"));  // already made: nothing to add
    std::FILE* f = std::fopen((base / "out" / "result.txt").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fclose(f);
  }
  EXPECT_TRUE(fs::exists(base / "out" / "result.txt"));
  fs::remove_all(base);
}

}  // namespace
}  // namespace memfit::io
