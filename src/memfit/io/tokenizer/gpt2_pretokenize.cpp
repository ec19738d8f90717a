// GPT-2 pre-tokenization by hand over ICU categories; see gpt2_pretokenize.h.
#include "memfit/io/tokenizer/gpt2_pretokenize.h"

#include <unicode/uchar.h>
#include <unicode/utf8.h>

#include <cstdint>

namespace memfit::io {

namespace {

enum class CharClass : uint8_t { letter, number, space, other };

// JavaScript's \s: WhiteSpace and LineTerminator of ECMA-262, i.e. Zs and a fixed list.
bool is_js_space(UChar32 c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
      return true;
    default:
      return (c >= 0x2000 && c <= 0x200A) || u_charType(c) == U_SPACE_SEPARATOR;
  }
}

CharClass classify(UChar32 c) {
  if (c < 0) return CharClass::other;  // ill-formed UTF-8
  if (c < 0x80) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::letter;
    if (c >= '0' && c <= '9') return CharClass::number;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return CharClass::space;
    return CharClass::other;
  }
  uint32_t mask = U_GET_GC_MASK(c);
  if (mask & U_GC_L_MASK) return CharClass::letter;
  if (mask & U_GC_N_MASK) return CharClass::number;
  if (is_js_space(c)) return CharClass::space;
  return CharClass::other;
}

// One decoded character: where its bytes start and what it is.
struct Unit {
  int32_t begin;
  CharClass cls;
  bool is_space_char;  // exactly U+0020, the optional prefix of the letter/number/other runs
};

// Length of the contraction ('s 't 're 've 'm 'll 'd) at the start of `s`, or 0.
size_t contraction_length(std::string_view s) {
  if (s.size() < 2 || s[0] != '\'') return 0;
  char a = s[1];
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (s.size() >= 3) {
    char b = s[2];
    if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  }
  return 0;
}

}  // namespace

void gpt2_pretokenize(std::string_view text, std::vector<std::string_view>& out) {
  const auto* s = reinterpret_cast<const uint8_t*>(text.data());
  const int32_t length = static_cast<int32_t>(text.size());
  std::vector<Unit> units;
  units.reserve(text.size() + 1);
  for (int32_t i = 0; i < length;) {
    int32_t begin = i;
    UChar32 c;
    U8_NEXT(s, i, length, c);
    units.push_back({begin, classify(c), c == 0x20});
  }
  const size_t n = units.size();
  units.push_back({length, CharClass::other, false});  // sentinel: units[n].begin is the end
  auto piece = [&](size_t from, size_t to) {
    out.push_back(text.substr(units[from].begin, units[to].begin - units[from].begin));
  };

  size_t i = 0;
  while (i < n) {
    // 's|'t|'re|'ve|'m|'ll|'d: ASCII, so characters and bytes coincide.
    if (size_t len = contraction_length(text.substr(units[i].begin))) {
      piece(i, i + len);
      i += len;
      continue;
    }
    // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: an optional U+0020, then a run of one class.
    size_t start = i, j = i;
    if (units[i].is_space_char && i + 1 < n && units[i + 1].cls != CharClass::space) j = i + 1;
    CharClass cls = units[j].cls;
    if (cls != CharClass::space) {
      while (j < n && units[j].cls == cls) ++j;
      piece(start, j);
      i = j;
      continue;
    }
    // `\s+(?!\S)|\s+`: the whole run at the end of the text; otherwise the run less its last
    // character, which then leads the next piece; a single space character on its own.
    size_t end = i;
    while (end < n && units[end].cls == CharClass::space) ++end;
    if (end < n && end - i >= 2) --end;
    piece(i, end);
    i = end;
  }
}

}  // namespace memfit::io
