// Token shards: round trip, llm.c's exact layout, and every way a shard can be rejected, each
// with a message that names the file, the field and the expected and actual values.
#include "memfit/io/data/token_shard.h"

#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "io_test_util.h"
#include "memfit/core/error.h"

namespace memfit::io {
namespace {

using testing::read_file;
using testing::TempDir;
using testing::write_file;

std::vector<uint16_t> sample_tokens(size_t n) {
  std::vector<uint16_t> t(n);
  for (size_t i = 0; i < n; ++i) t[i] = static_cast<uint16_t>((i * 7919) % 50257);
  return t;
}

// The IoError message of reading `path`, or "" if it reads.
std::string read_error(const std::filesystem::path& path, std::optional<int32_t> vocab = {}) {
  MemoryPool pool;
  try {
    read_token_shard(path, pool, vocab);
  } catch (const IoError& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& message, std::initializer_list<const char*> parts) {
  ASSERT_FALSE(message.empty()) << "expected an IoError";
  for (const char* p : parts)
    EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
}

TEST(TokenShard, RoundTripIntoPoolMemory) {
  TempDir dir;
  auto tokens = sample_tokens(1000);
  write_token_shard(dir / "train_000000.bin", tokens);
  MemoryPool pool;
  Tensor t = read_token_shard(dir / "train_000000.bin", pool, 50257);
  EXPECT_EQ(t.dtype(), DType::u16);
  EXPECT_EQ(t.shape(), Shape({1000}));
  EXPECT_EQ(t.category(), Category::staging);
  EXPECT_GE(pool.bytes_current(Category::staging), 2000u);
  EXPECT_EQ(std::memcmp(t.data<uint16_t>(), tokens.data(), 2000), 0);
  EXPECT_EQ(read_token_shard_header(dir / "train_000000.bin"), 1000);
  // Nothing but the shard is left in the folder: the temporary file was renamed.
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

TEST(TokenShard, LayoutIsLlmcs) {
  TempDir dir;
  write_token_shard(dir / "s.bin", std::vector<uint16_t>{1, 2, 65535});
  std::string bytes = read_file(dir / "s.bin");
  ASSERT_EQ(bytes.size(), 1024u + 6u);
  int32_t header[256];
  std::memcpy(header, bytes.data(), 1024);
  EXPECT_EQ(header[0], 20240520);
  EXPECT_EQ(header[1], 1);
  EXPECT_EQ(header[2], 3);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header[i], 0);
  uint16_t t[3];
  std::memcpy(t, bytes.data() + 1024, 6);
  EXPECT_EQ(t[2], 65535);
}

TEST(TokenShard, EmptyShardReads) {
  TempDir dir;
  write_token_shard(dir / "e.bin", std::vector<uint16_t>{});
  MemoryPool pool;
  EXPECT_EQ(read_token_shard(dir / "e.bin", pool).numel(), 0);
}

TEST(TokenShard, RewriteReplacesAtomically) {
  TempDir dir;
  write_token_shard(dir / "s.bin", sample_tokens(10));
  write_token_shard(dir / "s.bin", sample_tokens(20));
  EXPECT_EQ(read_token_shard_header(dir / "s.bin"), 20);
}

TEST(TokenShard, WriteIntoMissingFolderFailsCleanly) {
  TempDir dir;
  EXPECT_THROW(write_token_shard(dir / "nope" / "s.bin", sample_tokens(3)), IoError);
}

class TokenShardRejects : public ::testing::Test {
 protected:
  void SetUp() override {
    write_token_shard(path_, sample_tokens(100));
    bytes_ = read_file(path_);
  }
  void set_header(int index, int32_t value) {
    std::memcpy(bytes_.data() + 4 * index, &value, 4);
    write_file(path_, bytes_);
  }
  TempDir dir_;
  std::filesystem::path path_ = dir_ / "train_000001.bin";
  std::string bytes_;
};

TEST_F(TokenShardRejects, MissingFile) {
  expect_contains(read_error(dir_ / "nope.bin"), {"nope.bin", "cannot open"});
}

TEST_F(TokenShardRejects, BadMagic) {
  set_header(0, 12345);
  expect_contains(read_error(path_), {"train_000001.bin", "magic", "12345", "20240520"});
}

TEST_F(TokenShardRejects, WrongVersion) {
  set_header(1, 2);
  expect_contains(read_error(path_), {"train_000001.bin", "version", "is 2", "expected 1"});
}

TEST_F(TokenShardRejects, TruncatedTokens) {
  bytes_.resize(1024 + 150);
  write_file(path_, bytes_);
  expect_contains(read_error(path_),
                  {"train_000001.bin", "token count", "100", "1224 bytes", "1174 bytes",
                   "truncated"});
}

TEST_F(TokenShardRejects, TruncatedHeader) {
  bytes_.resize(100);
  write_file(path_, bytes_);
  expect_contains(read_error(path_), {"train_000001.bin", "truncated", "100 bytes", "1024"});
}

TEST_F(TokenShardRejects, CountMismatch) {
  set_header(2, 99);  // the file holds 100 tokens
  expect_contains(read_error(path_),
                  {"train_000001.bin", "token count", "is 99", "1222 bytes", "1224 bytes",
                   "trailing"});
  set_header(2, -5);
  expect_contains(read_error(path_), {"train_000001.bin", "token count", "-5"});
}

TEST_F(TokenShardRejects, TokenBeyondVocabulary) {
  std::vector<uint16_t> t(10, 5);
  t[7] = 300;
  write_token_shard(path_, t);
  EXPECT_EQ(read_error(path_, 301), "");
  expect_contains(read_error(path_, 256),
                  {"train_000001.bin", "token 300", "position 7", "< 256"});
}

TEST_F(TokenShardRejects, WrongVersionForTheU32Magic) {
  set_header(0, 20240801);
  set_header(1, 2);
  expect_contains(read_error(path_),
                  {"train_000001.bin", "version", "is 2", "expected 7", "20240801", "uint32"});
}

// ---- version 2: uint32 tokens, llm.c's Llama 3 header ----

TEST(TokenShardU32, LayoutIsLlmcsLlama3Header) {
  TempDir dir;
  write_token_shard(dir / "s.bin", std::vector<uint32_t>{1, 128000, 4000000000u});
  std::string bytes = read_file(dir / "s.bin");
  ASSERT_EQ(bytes.size(), 1024u + 12u);
  int32_t header[256];
  std::memcpy(header, bytes.data(), 1024);
  EXPECT_EQ(header[0], 20240801);
  EXPECT_EQ(header[1], 7);
  EXPECT_EQ(header[2], 3);
  for (int i = 3; i < 256; ++i) EXPECT_EQ(header[i], 0);
  uint32_t t[3];
  std::memcpy(t, bytes.data() + 1024, 12);
  EXPECT_EQ(t[1], 128000u);
  EXPECT_EQ(t[2], 4000000000u);
  ShardInfo info = read_token_shard_info(dir / "s.bin");
  EXPECT_EQ(info.count, 3);
  EXPECT_EQ(info.token_bytes, 4);
}

TEST(TokenShardU32, RoundTripIntoPoolMemoryAsInt32) {
  TempDir dir;
  std::vector<int32_t> ids(1000);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919) % 128256);
  write_token_shard(dir / "train_000000.bin", ids, 4);
  MemoryPool pool;
  Tensor t = read_token_shard(dir / "train_000000.bin", pool, 128256);
  EXPECT_EQ(t.dtype(), DType::i32);
  EXPECT_EQ(t.shape(), Shape({1000}));
  EXPECT_EQ(std::memcmp(t.data<int32_t>(), ids.data(), 4000), 0);
  EXPECT_EQ(read_token_shard_header(dir / "train_000000.bin"), 1000);
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 1);
}

TEST(TokenShardU32, IntIdsPickTheirWidth) {
  TempDir dir;
  std::vector<int32_t> small = {0, 5, 65535};
  write_token_shard(dir / "a.bin", small, 2);
  EXPECT_EQ(read_token_shard_info(dir / "a.bin").token_bytes, 2);
  std::vector<int32_t> back(3);
  read_token_shard_into(dir / "a.bin", std::span<int32_t>(back));
  EXPECT_EQ(back, small);
  write_token_shard(dir / "b.bin", small, 4);
  std::vector<uint16_t> narrow(3);
  EXPECT_THROW(read_token_shard_into(dir / "b.bin", std::span<uint16_t>(narrow)), IoError);
  read_token_shard_into(dir / "b.bin", std::span<int32_t>(back));
  EXPECT_EQ(back, small);
  EXPECT_EQ(shard_token_bytes_for_vocab(50257), 2);
  EXPECT_EQ(shard_token_bytes_for_vocab(65536), 2);
  EXPECT_EQ(shard_token_bytes_for_vocab(65537), 4);
  EXPECT_EQ(shard_token_bytes_for_vocab(128256), 4);
}

TEST(TokenShardU32, VersionOneCannotHoldAWideIdAndSaysSo) {
  TempDir dir;
  std::vector<int32_t> ids = {1, 2, 128000, 4};
  try {
    write_token_shard(dir / "v1.bin", ids, 2);
    FAIL() << "no error";
  } catch (const IoError& e) {
    expect_contains(e.what(), {"v1.bin", "token 128000", "position 2", "version-1", "65535",
                               "version-2", "uint32"});
  }
  EXPECT_FALSE(std::filesystem::exists(dir / "v1.bin"));
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir.path()), {}), 0);
  std::vector<int32_t> negative = {1, -3};
  EXPECT_THROW(write_token_shard(dir / "n.bin", negative, 4), IoError);
  EXPECT_THROW(write_token_shard(dir / "n.bin", negative, 3), Error);
}

TEST(TokenShardU32, CorruptHeadersAndSizesAreRejected) {
  TempDir dir;
  auto path = dir / "train_000002.bin";
  write_token_shard(path, std::vector<uint32_t>(100, 7));
  std::string bytes = read_file(path);
  // 100 uint32 tokens: 1424 bytes; cut to 1224 (what 100 uint16 would take) it is truncated.
  std::string cut = bytes.substr(0, 1224);
  write_file(path, cut);
  expect_contains(read_error(path), {"train_000002.bin", "token count", "100", "1024 + 4 * 100",
                                     "1424 bytes", "1224 bytes", "truncated"});
  // The uint16 magic on uint32 data: the size no longer fits the count.
  std::string relabeled = bytes;
  int32_t v1[2] = {20240520, 1};
  std::memcpy(relabeled.data(), v1, 8);
  write_file(path, relabeled);
  expect_contains(read_error(path), {"train_000002.bin", "1224 bytes", "1424 bytes", "trailing"});
  // Version 1 under the uint32 magic.
  std::string mixed = bytes;
  int32_t v2[2] = {20240801, 1};
  std::memcpy(mixed.data(), v2, 8);
  write_file(path, mixed);
  expect_contains(read_error(path), {"train_000002.bin", "version", "is 1", "expected 7"});
  // A uint32 token above INT32_MAX is not an id memfit can hold.
  write_token_shard(path, std::vector<uint32_t>{1, 3000000000u});
  expect_contains(read_error(path), {"train_000002.bin", "3000000000", "position 1"});
  write_token_shard(path, std::vector<uint32_t>{1, 70000, 2});
  EXPECT_EQ(read_error(path, 70001), "");
  expect_contains(read_error(path, 70000), {"train_000002.bin", "token 70000", "position 1",
                                            "< 70000"});
}

}  // namespace
}  // namespace memfit::io
