// Strings for the tokenizer parity tests (GPT-2 and tokenizer.json against their JavaScript
// encoders): deterministic, and covering every Unicode category the pre-tokenizers distinguish,
// white space runs and ends, contractions, numbers, punctuation runs, emoji and combining marks.
#pragma once

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace memfit::io::testing {

// Deterministic strings that exercise every branch of the pre-tokenizer and the BPE.
class StringGenerator {
 public:
  explicit StringGenerator(uint64_t seed) : rng_(seed) {}

  std::string next() {
    std::string s;
    if (coin(0.15)) s += pick(kSpaces);  // leading whitespace
    const int atoms = 1 + static_cast<int>(rng_() % 10);
    for (int i = 0; i < atoms; ++i) {
      if (i > 0 && coin(0.6)) s += coin(0.85) ? " " : pick(kSpaces);
      s += atom();
    }
    if (coin(0.2)) s += pick(kSpaces);  // trailing whitespace
    return s;
  }
  // 1 to 24 code points drawn from all assigned ones (Unicode <= 12, so ICU and Node agree).
  std::string random_code_points() {
    std::string s;
    const int n = 1 + static_cast<int>(rng_() % 24);
    for (int i = 0; i < n; ++i) append_utf8(s, random_code_point());
    return s;
  }

 private:
  static inline const std::vector<std::string> kWords = {
      "hello", "world", "The", "quick", "brown", "fox", "memfit", "GPT", "Transformer", "a",
      "I", "don", "can", "naïve", "résumé", "Straße", "ﬁne", "Ångström", "über", "façade",
      "ÉCOLE", "Ελληνικά", "λόγος", "Привет", "мир", "Україна", "中文", "日本語", "漢字",
      "你好世界", "ひらがな", "カタカナ", "한국어", "مرحبا", "שלום", "नमस्ते", "สวัสดี",
      "ǅemal", "ʰʲ", "x86_64", "camelCase", "snake_case", "ALLCAPS", "Mc", "O'Neil"};
  static inline const std::vector<std::string> kContractions = {
      "'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "'Re", "n't", "'", "''", "'x",
      "don't", "I'LL", "we've", "it's", "y'all", "rock'n'roll", "'tis", "’s", "don’t"};
  static inline const std::vector<std::string> kNumbers = {
      "0", "7", "42", "2024", "3.14", "1,000,000", "007", "1e-9", "½", "²", "Ⅻ", "٣٤٥",
      "５６", "१२३", "๑๒", "⑦", "10th", "0x1F", "12:30", "-5"};
  static inline const std::vector<std::string> kPunct = {
      ".", ",", "!", "?", "...", "!!!", "?!", "--", "—", "–", "“", "”", "«", "»", "(", ")", "[",
      "]", "{", "}", "<|endoftext|>", "@#$%", "://", "=>", "\\", "/", "*", "&&", "||", "§",
      "¶", "€", "$", "¥", "™", "©", "\"", "\",\"", "'),", "}},{", "...\"", "`", "~~~", "^_^",
      "=====", "#!/bin/sh", "<div>", "</s>", "\x01", "\x7f", "\x1f"};
  static inline const std::vector<std::string> kSpaces = {
      " ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\r\n", " \n", "\n ", " \t ",
      "\xc2\xa0", "\xe3\x80\x80", "\xe2\x80\xa8", "\xe2\x80\xa9", "\x0b", "\x0c", "\xef\xbb\xbf",
      "\xc2\x85", "\xe2\x80\x83", "\xe2\x80\x8b", "\xe1\xa0\x8e", "\r", " \xc2\xa0 "};
  static inline const std::vector<std::string> kEmoji = {
      "😀", "👍🏽", "👨‍👩‍👧", "🇺🇸", "❤️", "🤖", "✨", "🎉🎉", "🙂🙃", "⚡", "👩🏿‍💻", "🏳️‍🌈"};
  static inline const std::vector<std::string> kCombining = {
      "e\xcc\x81", "a\xcc\x88", "\xcc\x81", "Z\xcd\x91\xcd\x92\xcd\x93", "\xe0\xa4\x95\xe0\xa5\x8d\xe0\xa4\xb7",
      "n\xcc\x83o", "\xe2\x83\x9d", "q\xcc\xa3\xcc\x87", "\xef\xb8\x8f"};

  bool coin(double p) { return static_cast<double>(rng_() >> 11) * 0x1.0p-53 < p; }
  const std::string& pick(const std::vector<std::string>& v) { return v[rng_() % v.size()]; }

  std::string atom() {
    switch (rng_() % 9) {
      case 0: case 1: case 2: return pick(kWords);
      case 3: return pick(kContractions);
      case 4: return pick(kNumbers);
      case 5: return pick(kPunct);
      case 6: return coin(0.5) ? pick(kEmoji) : pick(kCombining);
      case 7: return pick(kSpaces);
      default: return random_code_points();
    }
  }

  UChar32 random_code_point() {
    for (;;) {
      // Mostly the BMP, sometimes the supplementary planes.
      UChar32 c = coin(0.8) ? static_cast<UChar32>(rng_() % 0x10000)
                            : static_cast<UChar32>(0x10000 + rng_() % 0x30000);
      if (c >= 0xD800 && c <= 0xDFFF) continue;  // surrogates are not characters
      UVersionInfo age;
      u_charAge(c, age);
      if (age[0] == 0 || age[0] > 12) continue;  // unassigned, or newer than both ICU and Node
      return c;
    }
  }
  static void append_utf8(std::string& s, UChar32 c) {
    uint8_t buf[4];
    int32_t n = 0;
    [[maybe_unused]] UBool error = false;
    U8_APPEND(buf, n, 4, c, error);
    s.append(reinterpret_cast<char*>(buf), n);
  }

  std::mt19937_64 rng_;
};

}  // namespace memfit::io::testing
