// Token shards: round trip, llm.c's exact layout, and every way a shard can be rejected, each
// with a message that names the file, the field and the expected and actual values.
#include "memfit/io/token_shard.h"

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

}  // namespace
}  // namespace memfit::io
