// `memfit prepare --format chat|instruct` through the library: one window per record, padded
// with the pad token and masked out, a pad closing each split, loss masks beside the shards
// matching the template's mask, records cut or dropped at the window, the val split by records,
// dataset.json's window, a window mismatch refused by the loader, and malformed input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io_test_util.h"
#include "memfit/core/error.h"
#include "memfit/io/data/chat_template.h"
#include "memfit/io/data/data_loader.h"
#include "memfit/io/data/loss_mask.h"
#include "memfit/io/data/prepare.h"
#include "memfit/io/data/token_shard.h"
#include "memfit/io/tokenizer/byte_tokenizer.h"

namespace memfit::io {
namespace {

using testing::TempDir;
using testing::write_file;
namespace fs = std::filesystem;

std::vector<int32_t> shard_ids(const fs::path& path) {
  std::vector<int32_t> ids(static_cast<size_t>(read_token_shard_header(path)));
  read_token_shard_into(path, std::span<int32_t>(ids));
  return ids;
}

class PrepareChatTest : public ::testing::Test {
 protected:
  void SetUp() override {
    write_file(dir_ / "chat.jsonl",
               R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})"
               "\n"
               R"({"messages": [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}, {"role": "assistant", "content": "A long answer"}]})"
               "\n\n"
               R"({"messages": [{"role": "user", "content": "2"}, {"role": "assistant", "content": "3"}]})"
               "\n");
  }
  PrepareOptions options(int64_t window = 96, double val_fraction = 0.3) {
    PrepareOptions o;
    o.inputs = {(dir_ / "chat.jsonl").string()};
    o.out_dir = dir_ / "out";
    o.tokenizer = "byte";
    o.format = "chat";
    o.chat_template = "chatml";
    o.window = window;
    o.val_fraction = val_fraction;
    return o;
  }
  // The template's tokens and mask for record `i` of chat.jsonl.
  std::pair<std::vector<int32_t>, std::vector<uint8_t>> rendered(size_t i) {
    const auto records = read_chat_records(dir_ / "chat.jsonl", ChatFormat::chat);
    ByteTokenizer tok;
    std::vector<int32_t> ids;
    std::vector<uint8_t> mask;
    ChatTemplate(ChatTemplateKind::chatml, tok).render(records.at(i), ids, mask);
    return {ids, mask};
  }
  TempDir dir_;
};

TEST_F(PrepareChatTest, OneWindowPerRecordWithMasksBesideTheShards) {
  const PrepareSummary s = prepare_dataset(options(96));
  EXPECT_EQ(s.records, 3);
  EXPECT_EQ(s.records_truncated, 1);  // the long answer's record is cut to 96 tokens (its answer starts at 83)
  EXPECT_EQ(s.records_dropped, 0);
  // 30% of 3 records: the last one is val. Each split: its windows and one pad.
  EXPECT_EQ(s.train_tokens, 2 * 96 + 1);
  EXPECT_EQ(s.val_tokens, 96 + 1);
  ASSERT_EQ(s.train_files.size(), 1u);
  const auto ids = shard_ids(s.train_files[0]);
  const auto mask = read_loss_mask(loss_mask_path(s.train_files[0]));
  ASSERT_EQ(mask.size(), ids.size());
  const auto [r0, m0] = rendered(0);
  ASSERT_LT(r0.size(), 96u);
  for (size_t i = 0; i < 96; ++i) {  // record 0, then padding (end of text, masked out)
    EXPECT_EQ(ids[i], i < r0.size() ? r0[i] : ByteTokenizer::kEndOfText) << i;
    EXPECT_EQ(mask[i], i < r0.size() ? m0[i] : 0) << i;
  }
  const auto [r1, m1] = rendered(1);
  ASSERT_GT(r1.size(), 96u);
  for (size_t i = 0; i < 96; ++i) {  // record 1, cut
    EXPECT_EQ(ids[96 + i], r1[i]);
    EXPECT_EQ(mask[96 + i], m1[i]);
  }
  EXPECT_EQ(ids[192], ByteTokenizer::kEndOfText);  // the closing pad
  EXPECT_EQ(mask[192], 0);
  int64_t trained = 0;
  for (uint8_t b : mask) trained += b;
  EXPECT_EQ(trained, s.train_masked);
  EXPECT_EQ(read_loss_mask(loss_mask_path(s.val_files[0])).size(), 97u);

  const auto info = read_dataset_info(dir_ / "out");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->format, "chat");
  EXPECT_EQ(info->chat_template, "chatml");
  EXPECT_EQ(info->window, 96);

  // The loader: windows of T = 96 are the records; any other T is refused.
  MemoryPool pool;
  DataLoaderOptions d;
  d.batch_size = 1;
  d.seq_len = 96;
  DataLoader loader = DataLoader::train(pool, dir_ / "out", d);
  EXPECT_EQ(loader.num_windows(), 2);
  EXPECT_TRUE(loader.has_loss_mask());
  d.seq_len = 16;
  try {
    DataLoader::train(pool, dir_ / "out", d);
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("--seq-len 96"), std::string::npos) << e.what();
  }
  EXPECT_THROW(DataLoader::val(pool, dir_ / "out", d), ConfigError);
}

TEST_F(PrepareChatTest, RecordsWithNothingTrainedInTheWindowAreDropped) {
  // At 80 tokens the system-prompt record's answer (from token 83) lies past the window.
  const auto [r1, m1] = rendered(1);
  size_t first = 0;
  while (!m1[first]) ++first;
  ASSERT_GE(first, 80u);
  const PrepareSummary s = prepare_dataset(options(80, 0));
  EXPECT_EQ(s.records, 2);
  EXPECT_EQ(s.records_dropped, 1);
  EXPECT_EQ(s.train_tokens, 2 * 80 + 1);
  EXPECT_TRUE(s.val_files.empty());
}

TEST_F(PrepareChatTest, TextOverChatRemovesTheOldMasks) {
  prepare_dataset(options());
  ASSERT_TRUE(fs::exists(dir_ / "out" / "train_000000.mask"));
  write_file(dir_ / "doc.txt", "plain text that is long enough to split, it says");
  PrepareOptions o;
  o.inputs = {(dir_ / "doc.txt").string()};
  o.out_dir = dir_ / "out";
  o.tokenizer = "byte";
  o.overwrite = true;
  prepare_dataset(o);
  EXPECT_FALSE(fs::exists(dir_ / "out" / "train_000000.mask"));
  EXPECT_FALSE(fs::exists(dir_ / "out" / "val_000000.mask"));
  EXPECT_EQ(read_dataset_info(dir_ / "out")->window, 0);
}

TEST_F(PrepareChatTest, BadInputFailsAndWritesNothing) {
  auto fails = [&](PrepareOptions o, const std::string& needle) {
    try {
      prepare_dataset(o);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir_ / "out")) << needle;
  };
  fails(options(0), "--seq-len");
  PrepareOptions o = options();
  o.format = "csv";
  fails(o, "unknown format");
  o = options();
  o.chat_template = "llama3";  // the byte tokenizer has no Llama 3 special tokens
  fails(o, "<|begin_of_text|>");
  write_file(dir_ / "bad.jsonl",
             R"({"messages": [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Yo"}]})"
             "\n"
             R"({"messages": [{"role": "user", "content": 5}]})"
             "\n");
  o = options();
  o.inputs = {(dir_ / "bad.jsonl").string()};
  fails(o, (dir_ / "bad.jsonl").string() + ":2: field messages[0].content");
  o.format = "instruct";
  fails(o, ":1: field prompt: missing");
  o = options(96, 0.5);
  o.inputs = {(dir_ / "one.jsonl").string()};
  write_file(dir_ / "one.jsonl", R"({"prompt": "a", "completion": "b"})");
  o.format = "instruct";
  fails(o, "too few");
}

}  // namespace
}  // namespace memfit::io
