// GPT-2's pre-tokenizer on hand-checked cases: each alternative of the pattern, whitespace runs
// before words and at the end, Unicode letter/number/space classes, ill-formed UTF-8.
#include "memfit/io/tokenizer/gpt2_pretokenize.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace memfit::io {
namespace {

std::vector<std::string> pieces(std::string_view text) {
  std::vector<std::string_view> views;
  gpt2_pretokenize(text, views);
  return {views.begin(), views.end()};
}

TEST(Gpt2Pretokenize, SplitsLikeGpt2sPattern) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(pieces("I don't know, I'LL see"),
            (V{"I", " don", "'t", " know", ",", " I", "'", "LL", " see"}));
  EXPECT_EQ(pieces("it's 'sup 're"), (V{"it", "'s", " '", "sup", " '", "re"}));
  EXPECT_EQ(pieces("a  b"), (V{"a", " ", " b"}));          // the run's last space leads "b"
  EXPECT_EQ(pieces("a\n\nb"), (V{"a", "\n", "\n", "b"}));  // only U+0020 prefixes a word
  EXPECT_EQ(pieces("a \n b"), (V{"a", " \n", " b"}));
  EXPECT_EQ(pieces("end   "), (V{"end", "   "}));          // at the end the whole run
  EXPECT_EQ(pieces("x\t"), (V{"x", "\t"}));
  EXPECT_EQ(pieces(" 123abc!!?"), (V{" 123", "abc", "!!?"}));
  EXPECT_EQ(pieces("3.14"), (V{"3", ".", "14"}));
  EXPECT_EQ(pieces("naïve café"), (V{"naïve", " café"}));
  EXPECT_EQ(pieces("e\xcc\x81t\xc3\xa9"), (V{"e", "\xcc\x81", "t\xc3\xa9"}));  // Mn is not L
  EXPECT_EQ(pieces("日本語 テスト"), (V{"日本語", " テスト"}));
  EXPECT_EQ(pieces("½²Ⅻ"), (V{"½²Ⅻ"}));                    // No, No, Nl: all \p{N}
  EXPECT_EQ(pieces("a\xc2\xa0" "b"), (V{"a", "\xc2\xa0", "b"}));  // NBSP is \s, not " "
  EXPECT_EQ(pieces("😀 😀"), (V{"😀", " 😀"}));
  EXPECT_EQ(pieces(""), V{});
}

TEST(Gpt2Pretokenize, KeepsIllFormedUtf8AsCharacters) {
  std::string text = "ab\xff\xfe cd\xc3";
  auto p = pieces(text);
  ASSERT_EQ(p, (std::vector<std::string>{"ab", "\xff\xfe", " cd", "\xc3"}));
}

}  // namespace
}  // namespace memfit::io
