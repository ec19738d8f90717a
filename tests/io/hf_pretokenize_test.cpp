// The Split pre-tokenizer's pieces (Isolated, Removed, invert; regex and literal), JavaScript's
// white space, and the translation of JavaScript regular expressions into ICU's.
#include "memfit/io/tokenizer/hf_pretokenize.h"

#include <gtest/gtest.h>

#include "memfit/core/error.h"

namespace memfit::io {
namespace {

using Pieces = std::vector<std::string_view>;

Pieces split(const TextSplitter& s, std::string_view text) {
  Pieces out;
  s.split(text, out);
  return out;
}

TEST(TextSplitter, KeepsDropsOrInvertsMatches) {
  const std::string digits = js_regex_to_icu("\\d+", "t");
  EXPECT_EQ(split(TextSplitter(digits, false, false, false, "t"), "ab12cd3"),
            (Pieces{"ab", "12", "cd", "3"}));
  EXPECT_EQ(split(TextSplitter(digits, false, false, true, "t"), "ab12cd3"), (Pieces{"ab", "cd"}));
  EXPECT_EQ(split(TextSplitter(digits, false, true, false, "t"), "ab12cd3"), (Pieces{"12", "3"}));
  EXPECT_EQ(split(TextSplitter("--", true, false, false, "t"), "a--b----c"),
            (Pieces{"a", "--", "b", "--", "--", "c"}));
  EXPECT_EQ(split(TextSplitter(digits, false, false, false, "t"), ""), Pieces{});
  // Offsets are bytes of the UTF-8 text, whatever the characters before them.
  EXPECT_EQ(split(TextSplitter(digits, false, false, false, "t"), "é😀1ü"),
            (Pieces{"é😀", "1", "ü"}));
  EXPECT_THROW(TextSplitter("(unclosed", false, false, false, "t"), ConfigError);
}

TEST(TextSplitter, Llama3PatternCutsAsJavaScriptDoes) {
  const std::string pattern = js_regex_to_icu(
      "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
      "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+", "t");
  TextSplitter s(pattern, false, false, false, "t");
  EXPECT_EQ(split(s, "I'LL pay 12345 now!!\n\n  ok"),
            (Pieces{"I", "'LL", " pay", " ", "123", "45", " now", "!!\n\n", " ", " ok"}));
  // U+FEFF is JavaScript white space (ICU's \s would not take it); U+0085 is not.
  EXPECT_EQ(split(s, "a\xef\xbb\xbf\xef\xbb\xbf b"), (Pieces{"a", "\xef\xbb\xbf\xef\xbb\xbf", " b"}));
  EXPECT_EQ(split(s, "a\xc2\x85" "b"), (Pieces{"a", "\xc2\x85" "b"}));
}

TEST(JsWhiteSpace, TrimsAsStringTrimDoes) {
  EXPECT_EQ(js_trim_start(" \t\xc2\xa0\xef\xbb\xbfx y "), "x y ");
  EXPECT_EQ(js_trim_end(" x y\n\xe2\x80\xa8\xe3\x80\x80"), " x y");
  EXPECT_EQ(js_trim_end("x\xc2\x85"), "x\xc2\x85");  // NEL is not JavaScript white space
  EXPECT_EQ(js_trim_start("   "), "");
  EXPECT_TRUE(js_is_space(0xFEFF));
  EXPECT_FALSE(js_is_space(0x85));
  EXPECT_FALSE(js_is_space(0x200B));
}

TEST(JsRegexToIcu, SpellsOutJavaScriptClasses) {
  const std::string space = "\\t\\n\\x0B\\f\\r\\x20\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029"
                            "\\u202F\\u205F\\u3000\\uFEFF";
  EXPECT_EQ(js_regex_to_icu("\\s+(?!\\S)", "t"), "[" + space + "]+(?![^" + space + "])");
  EXPECT_EQ(js_regex_to_icu("[^\\s\\p{L}\\d]", "t"), "[^" + space + "\\p{L}0-9]");
  EXPECT_EQ(js_regex_to_icu("[\\w&$ ]\\W", "t"), "[A-Za-z0-9_\\&\\$\\x20][^A-Za-z0-9_]");
  EXPECT_EQ(js_regex_to_icu("[[]\\u{1F600}", "t"), "[\\[]\\x{1F600}");
  EXPECT_EQ(js_regex_to_icu("(?i:'s|'t|'re|'ve|'m|'ll|'d)|x", "t"),
            "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))|x");
  EXPECT_THROW(js_regex_to_icu("\\bword", "t"), ConfigError);
  EXPECT_THROW(js_regex_to_icu("(?i)x", "t"), ConfigError);
  EXPECT_THROW(js_regex_to_icu("[abc", "t"), ConfigError);
}

}  // namespace
}  // namespace memfit::io
