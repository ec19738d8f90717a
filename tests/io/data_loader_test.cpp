// The data loader's order contract (docs/data.md): exact windows without shuffle, including the
// wrap; with shuffle a seeded permutation per epoch; resume by position; val in order.
#include "memfit/io/data/data_loader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>

#include "io_test_util.h"
#include "memfit/core/error.h"
#include "memfit/io/data/token_shard.h"

namespace memfit::io {
namespace {

using testing::TempDir;

// Shards whose token at global position i is i (so a window shows where it came from).
void write_counting_shards(const std::filesystem::path& dir, const std::string& split,
                           std::vector<int> sizes, int first = 0) {
  int next = first;
  for (size_t s = 0; s < sizes.size(); ++s) {
    std::vector<uint16_t> t(sizes[s]);
    for (auto& x : t) x = static_cast<uint16_t>(next++);
    write_token_shard(dir / fmt::format("{}_{:06d}.bin", split, s), t);
  }
}

class DataLoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // 103 tokens over three shards, written out of name order; T = 8 gives floor(102/8) = 12
    // windows. A val split and an unrelated file sit beside them.
    write_counting_shards(dir_.path(), "train", {40, 23, 40});
    write_counting_shards(dir_.path(), "val", {30}, 1000);
    testing::write_file(dir_ / "notes.txt", "not a shard");
  }
  DataLoaderOptions options(bool shuffle = false, uint64_t seed = 0) {
    DataLoaderOptions o;
    o.batch_size = 2;
    o.seq_len = 8;
    o.shuffle = shuffle;
    o.seed = seed;
    return o;
  }
  TempDir dir_;
  MemoryPool pool_;
};

TEST_F(DataLoaderTest, FindsShardsSortedByName) {
  auto shards = find_token_shards(dir_.path(), "train");
  ASSERT_EQ(shards.size(), 3u);
  EXPECT_EQ(shards[0].filename(), "train_000000.bin");
  EXPECT_EQ(shards[2].filename(), "train_000002.bin");
  EXPECT_TRUE(find_token_shards(dir_.path(), "test").empty());
}

TEST_F(DataLoaderTest, WithoutShuffleReadsExactWindowsAndWraps) {
  DataLoader loader = DataLoader::train(pool_, dir_.path(), options());
  EXPECT_EQ(loader.num_tokens(), 103);
  EXPECT_EQ(loader.num_windows(), 12);
  EXPECT_EQ(loader.batches_per_epoch(), 6);
  const int32_t* x = loader.inputs().data<int32_t>();
  const int32_t* y = loader.targets().data<int32_t>();
  for (int64_t k = 0; k < 15; ++k) {  // two and a half epochs: wraps after k = 5
    ASSERT_EQ(loader.position(), k);
    loader.next_batch();
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t w = (k * 2 + b) % 12;
      ASSERT_EQ(loader.window_index(k, b), w);
      for (int64_t t = 0; t < 8; ++t) {
        ASSERT_EQ(x[b * 8 + t], w * 8 + t) << "k=" << k << " b=" << b << " t=" << t;
        ASSERT_EQ(y[b * 8 + t], w * 8 + t + 1) << "k=" << k << " b=" << b << " t=" << t;
      }
    }
  }
  // Window 11 reads tokens 88..96; tokens 97..102 are never a whole window.
}

TEST_F(DataLoaderTest, BatchTensorsAreAllocatedOnceFromThePool) {
  DataLoader loader = DataLoader::train(pool_, dir_.path(), options());
  EXPECT_EQ(loader.inputs().dtype(), DType::i32);
  EXPECT_EQ(loader.inputs().shape(), Shape({2, 8}));
  EXPECT_EQ(loader.targets().shape(), Shape({2, 8}));
  EXPECT_EQ(loader.inputs().category(), Category::staging);
  const void* before = loader.inputs().raw_data();
  const uint64_t allocations = pool_.allocation_count();
  for (int i = 0; i < 10; ++i) loader.next_batch();
  EXPECT_EQ(loader.inputs().raw_data(), before);
  EXPECT_EQ(pool_.allocation_count(), allocations);
  // Tokens (103 u16) and the two (2, 8) int32 batches, all staging.
  EXPECT_EQ(pool_.bytes_current(), pool_.bytes_current(Category::staging));
}

TEST_F(DataLoaderTest, StagingDoesNotGrowWithTheData) {
  // The shards stay on disk: a 40,000-token split stages what the 103-token one does, but for
  // the shuffle's permutation (4 bytes a window); staging_bytes predicts it from headers.
  TempDir big;
  write_counting_shards(big.path(), "train", {20000, 20000});
  for (bool shuffle : {false, true}) {
    size_t staged[2];
    int i = 0;
    for (const auto& dir : {dir_.path(), big.path()}) {
      MemoryPool pool;
      DataLoader loader = DataLoader::train(pool, dir, options(shuffle));
      loader.next_batch();
      staged[i++] = pool.bytes_peak(Category::staging);
      EXPECT_EQ(pool.bytes_peak(Category::staging),
                DataLoader::staging_bytes(find_token_shards(dir, "train"), options(shuffle)));
      EXPECT_EQ(pool.bytes_peak(Category::staging),
                DataLoader::buffer_bytes(options(shuffle)) +
                    DataLoader::permutation_bytes(options(shuffle), loader.num_windows()));
    }
    if (!shuffle) {
      EXPECT_EQ(staged[0], staged[1]);
    } else {
      EXPECT_EQ(staged[1] - staged[0],
                MemoryPool::round_up(4999 * 4) - MemoryPool::round_up(12 * 4));
    }
  }
}

TEST_F(DataLoaderTest, ScanReadsEveryTokenInFileOrder) {
  DataLoader loader = DataLoader::train(pool_, dir_.path(), options());
  loader.next_batch();
  std::vector<int32_t> before(loader.inputs().data<int32_t>(),
                              loader.inputs().data<int32_t>() + 16);
  std::vector<int32_t> all;
  loader.scan([&](std::span<const int32_t> t) { all.insert(all.end(), t.begin(), t.end()); });
  ASSERT_EQ(all.size(), 103u);
  for (size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], static_cast<int32_t>(i));
  EXPECT_TRUE(std::equal(before.begin(), before.end(), loader.inputs().data<int32_t>()));
}

TEST_F(DataLoaderTest, ShuffleVisitsEachWindowOncePerEpoch) {
  DataLoader loader = DataLoader::train(pool_, dir_.path(), options(true, 1234));
  std::vector<int64_t> visits;
  for (int64_t k = 0; k < 24; ++k) {  // 48 windows: four epochs of 12
    loader.next_batch();
    for (int64_t b = 0; b < 2; ++b) {
      int64_t w = loader.window_index(k, b);
      visits.push_back(w);
      for (int64_t t = 0; t < 8; ++t) {
        ASSERT_EQ(loader.inputs().data<int32_t>()[b * 8 + t], w * 8 + t);
        ASSERT_EQ(loader.targets().data<int32_t>()[b * 8 + t], w * 8 + t + 1);
      }
    }
  }
  std::vector<int64_t> identity(12);
  std::iota(identity.begin(), identity.end(), 0);
  std::set<std::vector<int64_t>> orders;
  for (int e = 0; e < 4; ++e) {
    std::vector<int64_t> epoch(visits.begin() + e * 12, visits.begin() + (e + 1) * 12);
    orders.insert(epoch);
    std::sort(epoch.begin(), epoch.end());
    EXPECT_EQ(epoch, identity) << "epoch " << e << " is not a permutation";
  }
  EXPECT_GT(orders.size(), 1u) << "every epoch has the same order";
}

TEST_F(DataLoaderTest, ShuffleIsDeterministicBySeed) {
  auto windows = [&](uint64_t seed) {
    DataLoader loader = DataLoader::train(pool_, dir_.path(), options(true, seed));
    std::vector<int64_t> w;
    for (int64_t k = 0; k < 12; ++k)
      for (int64_t b = 0; b < 2; ++b) w.push_back(loader.window_index(k, b));
    return w;
  };
  EXPECT_EQ(windows(7), windows(7));
  EXPECT_NE(windows(7), windows(8));
}

TEST(ShuffledIndices, AreTheSameOnEveryPlatform) {
  // Golden values: std::mt19937_64 is specified exactly by the standard and the Fisher-Yates
  // with rejection sampling is memfit's own, so these must not change (resume depends on it).
  std::vector<int32_t> p(10);
  shuffled_indices(42, p.data(), 10);
  EXPECT_EQ(p, (std::vector<int32_t>{1, 7, 9, 0, 3, 8, 4, 2, 5, 6}));
  EXPECT_EQ(epoch_seed(0, 0), 16294208416658607535ull);
}

TEST_F(DataLoaderTest, ResumesFromAPosition) {
  for (bool shuffle : {false, true}) {
    DataLoader a = DataLoader::train(pool_, dir_.path(), options(shuffle, 99));
    for (int i = 0; i < 9; ++i) a.next_batch();
    DataLoader b = DataLoader::train(pool_, dir_.path(), options(shuffle, 99));
    b.set_position(8);
    b.next_batch();
    EXPECT_EQ(b.position(), 9);
    EXPECT_EQ(std::memcmp(a.inputs().raw_data(), b.inputs().raw_data(), a.inputs().nbytes()), 0);
    EXPECT_EQ(std::memcmp(a.targets().raw_data(), b.targets().raw_data(), a.targets().nbytes()),
              0);
    // Going back works too.
    a.set_position(8);
    a.next_batch();
    EXPECT_EQ(std::memcmp(a.inputs().raw_data(), b.inputs().raw_data(), a.inputs().nbytes()), 0);
  }
}

TEST_F(DataLoaderTest, ValReadsItsOwnShardsInOrder) {
  DataLoader val = DataLoader::val(pool_, dir_.path(), options(true, 5));  // shuffle ignored
  EXPECT_EQ(val.num_tokens(), 30);
  EXPECT_EQ(val.num_windows(), 3);
  for (int64_t k = 0; k < 3; ++k) {
    val.next_batch();
    for (int64_t b = 0; b < 2; ++b)
      EXPECT_EQ(val.inputs().data<int32_t>()[b * 8], 1000 + ((k * 2 + b) % 3) * 8);
  }
}

TEST_F(DataLoaderTest, Errors) {
  TempDir empty;
  EXPECT_THROW(DataLoader::train(pool_, empty.path(), options()), IoError);
  EXPECT_THROW(DataLoader::val(pool_, empty.path(), options()), IoError);
  DataLoaderOptions bad = options();
  bad.batch_size = 0;
  EXPECT_THROW(DataLoader::train(pool_, dir_.path(), bad), ConfigError);
  DataLoaderOptions long_rows = options();
  long_rows.seq_len = 103;  // needs 104 tokens
  EXPECT_THROW(DataLoader::train(pool_, dir_.path(), long_rows), IoError);
  long_rows.seq_len = 102;
  EXPECT_EQ(DataLoader::train(pool_, dir_.path(), long_rows).num_windows(), 1);
  DataLoaderOptions vocab = options();
  vocab.vocab_size = 100;  // tokens go up to 102
  EXPECT_THROW(DataLoader::train(pool_, dir_.path(), vocab), IoError);
}

// Version-2 shards (uint32 tokens, llm.c's Llama 3 header): ids above 65,535 reach the int32
// batches whole, a split may mix both versions, and a token past the vocabulary still names the
// vocabulary's source and the --vocab that holds it.
TEST(DataLoaderU32, ReadsWideTokensAndMixesVersions) {
  TempDir dir;
  std::vector<uint32_t> wide(50);
  for (size_t i = 0; i < wide.size(); ++i) wide[i] = 128000 + static_cast<uint32_t>(i);
  write_token_shard(dir / "train_000000.bin", std::span<const uint32_t>(wide));
  std::vector<uint16_t> narrow(30);
  for (size_t i = 0; i < narrow.size(); ++i) narrow[i] = static_cast<uint16_t>(60000 + i);
  write_token_shard(dir / "train_000001.bin", std::span<const uint16_t>(narrow));
  MemoryPool pool;
  DataLoaderOptions o;
  o.batch_size = 2;
  o.seq_len = 8;
  o.vocab_size = 128256;
  DataLoader loader = DataLoader::train(pool, dir.path(), o);
  EXPECT_EQ(loader.num_tokens(), 80);
  std::vector<int32_t> all;
  loader.scan([&](std::span<const int32_t> t) { all.insert(all.end(), t.begin(), t.end()); });
  ASSERT_EQ(all.size(), 80u);
  for (size_t i = 0; i < 80; ++i)
    ASSERT_EQ(all[i], i < 50 ? 128000 + int32_t(i) : 60000 + int32_t(i - 50)) << i;
  // Windows 0..9 in order: window 6 spans the two shards (tokens 48..56).
  for (int64_t k = 0; k < 4; ++k) {
    loader.next_batch();
    for (int64_t b = 0; b < 2; ++b) {
      const int64_t w = k * 2 + b;
      for (int64_t t = 0; t < 8; ++t) {
        ASSERT_EQ(loader.inputs().data<int32_t>()[b * 8 + t], all[w * 8 + t]);
        ASSERT_EQ(loader.targets().data<int32_t>()[b * 8 + t], all[w * 8 + t + 1]);
      }
    }
  }
  o.vocab_size = 128010;
  o.vocab_source = "preset llama-tiny";
  try {
    DataLoader::train(pool, dir.path(), o);
    FAIL() << "no error";
  } catch (const IoError& e) {
    std::string m = e.what();
    for (const char* part : {"train_000000.bin", "token 128010", "position 10", "< 128010",
                             "preset llama-tiny", "--vocab 128011"})
      EXPECT_NE(m.find(part), std::string::npos) << part << " not in: " << m;
  }
}

}  // namespace
}  // namespace memfit::io
