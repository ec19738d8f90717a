// The offloaded run's disk check (train/offload_disk.h): the verdict over every rank's files and
// free bytes, and the collective on whatever world runs the binary (alone, and in CI under
// mpirun with 2 and 4 ranks on one host, so they share /tmp's filesystem). No ASSERT before a
// collective: every rank runs the same calls.
#include "memfit/train/offload_disk.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/offload/scratch_file.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

dist::Communicator& world() {
  static std::unique_ptr<dist::Communicator> w = dist::make_world_communicator();
  return *w;
}

TEST(DiskShortfall, OneRankComparesItsFilesWithTheFreeBytes) {
  const std::vector<RankDisk> fits{{7, 100, 100}}, short_{{7, 101, 100}};
  EXPECT_FALSE(disk_shortfall(fits));
  const auto why = disk_shortfall(short_);
  ASSERT_TRUE(why);
  EXPECT_EQ(*why,
            "the offload files need 101 bytes (0.00 GiB) and the filesystem has 100 bytes (0.00 "
            "GiB) free");
}

TEST(DiskShortfall, RanksSharingAFilesystemNeedTheSumOfTheirFiles) {
  // Each of ranks 0 and 2 fits alone; together they do not. Rank 1 is on another filesystem.
  const std::vector<RankDisk> ranks{{1, 60, 100}, {2, 90, 100}, {1, 60, 100}};
  const auto why = disk_shortfall(ranks);
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("ranks 0 and 2 share a filesystem"), std::string::npos) << *why;
  EXPECT_NE(why->find("need 120 bytes"), std::string::npos) << *why;
  // The free bytes are the least any rank of the group saw.
  EXPECT_FALSE(disk_shortfall(std::vector<RankDisk>{{1, 50, 100}, {2, 90, 100}, {1, 50, 120}}));
  EXPECT_TRUE(disk_shortfall(std::vector<RankDisk>{{1, 50, 99}, {2, 90, 100}, {1, 50, 120}}));
}

TEST(DiskShortfall, ARankAloneOnItsFilesystemIsNamed) {
  const auto why = disk_shortfall(std::vector<RankDisk>{{1, 10, 100}, {2, 200, 100}});
  ASSERT_TRUE(why);
  EXPECT_NE(why->find("rank 1's offload files need 200 bytes"), std::string::npos) << *why;
}

TEST(CheckOffloadDisk, RanksOnOneHostAreCheckedTogether) {
  dist::Communicator& w = world();
  const fs::path base = fs::path(testing::TempDir()) / "memfit_offload_disk_test";
  const fs::path dir = base / ("rank-" + std::to_string(w.rank()));
  // Room for one rank's files alone (60% of the free bytes), not for two. The trainer makes the
  // directory first (io::CreatedDirectories), as here.
  fs::create_directories(dir);
  const uint64_t free = offload::free_disk_bytes(base);
  EXPECT_NO_THROW(check_offload_disk(w, dir, 1));
  std::string message;
  try {
    check_offload_disk(w, dir, free / 10 * 6);
  } catch (const IoError& e) {
    message = e.what();
  }
  if (w.size() == 1) {
    EXPECT_EQ(message, "");
  } else {
    EXPECT_NE(message.find("share a filesystem"), std::string::npos) << message;
    EXPECT_NE(message.find(dir.string()), std::string::npos) << message;
  }
  w.barrier();
  fs::remove_all(dir);
}

}  // namespace
}  // namespace memfit
