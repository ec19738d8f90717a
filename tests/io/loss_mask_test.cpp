// Loss-mask shards (loss_mask.h): round trip and header checks; the data loader carries the
// mask of each batch aligned with its targets (byte w T + t + 1 for target t of window w),
// counts a step's masked-in targets over every rank's rows, allocates the (B, T) mask once
// (counted by staging_bytes), and refuses masks that do not fit their shards.
#include "memfit/io/data/loss_mask.h"

#include <gtest/gtest.h>

#include <fstream>

#include "io_test_util.h"
#include "memfit/core/error.h"
#include "memfit/io/data/data_loader.h"
#include "memfit/io/data/token_shard.h"

namespace memfit::io {
namespace {

using testing::TempDir;
namespace fs = std::filesystem;

TEST(LossMaskShard, RoundTripsAndSitsBesideItsTokenShard) {
  TempDir dir;
  EXPECT_EQ(loss_mask_path(dir / "train_000003.bin"), dir / "train_000003.mask");
  const std::vector<uint8_t> m = {0, 1, 1, 0, 1};
  write_loss_mask(dir / "a.mask", m);
  EXPECT_EQ(fs::file_size(dir / "a.mask"), 1024u + 5u);
  EXPECT_EQ(read_loss_mask_header(dir / "a.mask"), 5);
  EXPECT_EQ(read_loss_mask(dir / "a.mask"), m);
  // A mask shard is not a token shard: find_token_shards does not list it.
  write_token_shard(dir / "train_000000.bin", std::vector<uint16_t>{1, 2, 3});
  write_loss_mask(dir / "train_000000.mask", std::vector<uint8_t>{0, 1, 1});
  EXPECT_EQ(find_token_shards(dir.path(), "train").size(), 1u);
}

TEST(LossMaskShard, RejectsBadBytesAndHeaders) {
  TempDir dir;
  EXPECT_THROW(write_loss_mask(dir / "b.mask", std::vector<uint8_t>{0, 2}), IoError);
  EXPECT_FALSE(fs::exists(dir / "b.mask"));
  write_loss_mask(dir / "c.mask", std::vector<uint8_t>{1, 1});
  {  // a trailing byte
    std::ofstream out(dir / "c.mask", std::ios::binary | std::ios::app);
    out.put(1);
  }
  EXPECT_THROW(read_loss_mask_header(dir / "c.mask"), IoError);
  write_token_shard(dir / "d.mask", std::vector<uint16_t>{1, 2});  // a token shard's magic
  try {
    read_loss_mask_header(dir / "d.mask");
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("bad magic"), std::string::npos) << e.what();
  }
}

class MaskedLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 33 tokens (i at position i) over two shards; mask byte i is 1 when i % 3 == 0.
    std::vector<uint16_t> t(33);
    std::vector<uint8_t> m(33);
    for (int i = 0; i < 33; ++i) {
      t[i] = static_cast<uint16_t>(i);
      m[i] = i % 3 == 0;
    }
    write_token_shard(dir_ / "train_000000.bin", std::span(t).first(20));
    write_token_shard(dir_ / "train_000001.bin", std::span(t).subspan(20));
    write_loss_mask(dir_ / "train_000000.mask", std::span(m).first(20));
    write_loss_mask(dir_ / "train_000001.mask", std::span(m).subspan(20));
  }
  DataLoaderOptions options(int world = 1, int rank = 0, bool shuffle = false) {
    DataLoaderOptions o;
    o.batch_size = 2;
    o.seq_len = 4;
    o.world = world;
    o.rank = rank;
    o.shuffle = shuffle;
    return o;
  }
  TempDir dir_;
  MemoryPool pool_;
};

TEST_F(MaskedLoaderTest, TheMaskLinesUpWithTheTargets) {
  DataLoader loader = DataLoader::train(pool_, dir_.path(), options());
  ASSERT_TRUE(loader.has_loss_mask());
  EXPECT_EQ(loader.loss_mask().shape(), Shape({2, 4}));
  EXPECT_EQ(loader.loss_mask().dtype(), DType::u8);
  EXPECT_EQ(loader.loss_mask().category(), Category::staging);
  for (int k = 0; k < 6; ++k) {  // 8 windows of 4: wraps, and crosses the shard boundary
    loader.next_batch();
    const int32_t* y = loader.targets().data<int32_t>();
    const uint8_t* m = loader.loss_mask().data<uint8_t>();
    for (int i = 0; i < 8; ++i) EXPECT_EQ(m[i], y[i] % 3 == 0) << "target " << y[i];
  }
}

TEST_F(MaskedLoaderTest, CountsTheMaskedInTargetsOfEveryRank) {
  // Windows w have targets 4w+1 .. 4w+4: of those, one or two are multiples of 3.
  auto masked_in_window = [](int64_t w) {
    int64_t n = 0;
    for (int64_t i = 4 * w + 1; i <= 4 * w + 4; ++i) n += i % 3 == 0;
    return n;
  };
  for (bool shuffle : {false, true}) {
    for (int world : {1, 2}) {
      std::vector<DataLoader> ranks;
      for (int r = 0; r < world; ++r)
        ranks.push_back(DataLoader::train(pool_, dir_.path(), options(world, r, shuffle)));
      for (int64_t k = 0; k < 5; ++k) {
        int64_t want = 0;
        for (int r = 0; r < world; ++r)
          for (int64_t b = 0; b < 2; ++b) want += masked_in_window(ranks[r].window_index(k, b));
        for (int r = 0; r < world; ++r) EXPECT_EQ(ranks[r].count_masked(k, 1), want);
        // And the batches' own masks sum to it.
        int64_t seen = 0;
        for (int r = 0; r < world; ++r) {
          ranks[r].set_position(k);
          ranks[r].next_batch();
          for (int i = 0; i < 8; ++i) seen += ranks[r].loss_mask().data<uint8_t>()[i];
        }
        EXPECT_EQ(seen, want);
      }
      EXPECT_EQ(ranks[0].count_masked(0, 3), ranks[0].count_masked(0, 1) +
                                                 ranks[0].count_masked(1, 1) +
                                                 ranks[0].count_masked(2, 1));
    }
  }
}

TEST_F(MaskedLoaderTest, StagingCountsTheMask) {
  MemoryPool pool;
  const auto shards = find_token_shards(dir_.path(), "train");
  DataLoader loader(pool, shards, options());
  loader.next_batch();
  EXPECT_EQ(pool.bytes_peak(Category::staging), DataLoader::staging_bytes(shards, options()));
  EXPECT_EQ(DataLoader::staging_bytes(shards, options()),
            DataLoader::buffer_bytes(options()) + MemoryPool::round_up(8));
  EXPECT_EQ(DataLoader::buffer_bytes(options(), true),
            DataLoader::buffer_bytes(options()) + MemoryPool::round_up(8));
}

TEST_F(MaskedLoaderTest, RefusesMasksThatDoNotFit) {
  // Only one shard of two with a mask.
  fs::remove(dir_ / "train_000001.mask");
  EXPECT_THROW(DataLoader::train(pool_, dir_.path(), options()), IoError);
  // A mask of another length than its shard.
  write_loss_mask(dir_ / "train_000001.mask", std::vector<uint8_t>(12, 1));
  try {
    DataLoader::train(pool_, dir_.path(), options());
    ADD_FAILURE() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("12 mask bytes"), std::string::npos) << e.what();
  }
  // A byte that is not 0 or 1, found when its batch is read.
  write_loss_mask(dir_ / "train_000001.mask", std::vector<uint8_t>(13, 1));
  {
    std::fstream f(dir_ / "train_000001.mask", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(1024 + 5);
    f.put(7);
  }
  DataLoader loader = DataLoader::train(pool_, dir_.path(), options());
  loader.set_position(3);  // windows 6 and 7: targets 25 .. 32, byte 25 the bad one
  EXPECT_THROW(loader.next_batch(), IoError);
}

}  // namespace
}  // namespace memfit::io
