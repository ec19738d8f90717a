// Split pre-tokenizers and JavaScript white space; see hf_pretokenize.h.
#include "memfit/io/tokenizer/hf_pretokenize.h"

#include <unicode/uchar.h>
#include <unicode/utext.h>
#include <unicode/utf8.h>

#include <cctype>
#include <string_view>
#include <utility>

#include "memfit/core/error.h"

namespace memfit::io {

bool js_is_space(int32_t c) {
  switch (c) {
    case 0x09: case 0x0A: case 0x0B: case 0x0C: case 0x0D: case 0x20: case 0xA0:
    case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F: case 0x3000: case 0xFEFF:
      return true;
    default:
      return c > 0x7F && ((c >= 0x2000 && c <= 0x200A) || u_charType(c) == U_SPACE_SEPARATOR);
  }
}

std::string_view js_trim_start(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const int32_t n = static_cast<int32_t>(s.size());
  int32_t i = 0;
  while (i < n) {
    int32_t next = i;
    UChar32 c;
    U8_NEXT(p, next, n, c);
    if (!js_is_space(c)) break;
    i = next;
  }
  return s.substr(static_cast<size_t>(i));
}

std::string_view js_trim_end(std::string_view s) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  int32_t end = static_cast<int32_t>(s.size());
  while (end > 0) {
    int32_t prev = end;
    UChar32 c;
    U8_PREV(p, 0, prev, c);
    if (!js_is_space(c)) break;
    end = prev;
  }
  return s.substr(0, static_cast<size_t>(end));
}

TextSplitter::TextSplitter(const std::string& pattern, bool literal, bool invert, bool removed,
                           const std::string& where)
    : invert_(invert), removed_(removed) {
  if (literal) {
    literal_ = pattern;
    return;
  }
  UErrorCode status = U_ZERO_ERROR;
  UParseError parse{};
  regex_.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(pattern), 0, parse,
                                          status));
  if (U_FAILURE(status) || !regex_)
    MEMFIT_THROW(ConfigError, "tokenizer", "{}: ICU cannot compile the regular expression "
                 "(translated to '{}'): {} at offset {}", where, pattern, u_errorName(status),
                 parse.offset);
}

TextSplitter::~TextSplitter() = default;

void TextSplitter::split(std::string_view text, std::vector<std::string_view>& out) const {
  size_t prev = 0;
  // One match [begin, end): the text before it (unless invert) and the match (unless removed).
  auto emit = [&](size_t begin, size_t end) {
    if (!invert_ && begin > prev) out.push_back(text.substr(prev, begin - prev));
    if (!removed_ && end > begin) out.push_back(text.substr(begin, end - begin));
    prev = end;
  };
  if (!regex_) {
    for (size_t at = text.find(literal_); at != std::string_view::npos;
         at = text.find(literal_, at + literal_.size()))
      emit(at, at + literal_.size());
  } else {
    UErrorCode status = U_ZERO_ERROR;
    UText* utext = utext_openUTF8(nullptr, text.data(), static_cast<int64_t>(text.size()),
                                  &status);
    std::unique_ptr<icu::RegexMatcher> matcher(regex_->matcher(status));
    if (U_SUCCESS(status)) matcher->reset(utext);
    while (U_SUCCESS(status) && matcher->find(status)) {
      const int64_t begin = matcher->start64(status), end = matcher->end64(status);
      if (U_FAILURE(status)) break;
      emit(static_cast<size_t>(begin), static_cast<size_t>(end));
    }
    matcher.reset();
    utext_close(utext);
    if (U_FAILURE(status))
      MEMFIT_THROW(Error, "tokenizer", "ICU regular expression match failed: {}",
                   u_errorName(status));
  }
  if (!invert_ && prev < text.size()) out.push_back(text.substr(prev));
}

// ---- JavaScript regular expressions in ICU ----

namespace {

// JavaScript's \s (ECMA-262 WhiteSpace and LineTerminator), as the inside of a set.
constexpr std::string_view kJsSpace =
    "\\t\\n\\x0B\\f\\r\\x20\\u00A0\\u1680\\u2000-\\u200A\\u2028\\u2029\\u202F\\u205F\\u3000"
    "\\uFEFF";
constexpr std::string_view kJsDigit = "0-9";
constexpr std::string_view kJsWord = "A-Za-z0-9_";

// transformers.js rewrites these before compiling (its PROBLEMATIC_REGEX_MAP): Python's inline
// case-insensitive group, which JavaScript lacks, becomes explicit letter pairs. memfit does the
// same so that it matches what transformers.js matches (with Unicode case folding, ICU's (?i)
// would also take U+017F LATIN SMALL LETTER LONG S for 's').
constexpr std::pair<std::string_view, std::string_view> kJsRewrites[] = {
    {"(?i:'s|'t|'re|'ve|'m|'ll|'d)", "(?:'([sS]|[tT]|[rR][eE]|[vV][eE]|[mM]|[lL][lL]|[dD]))"},
};

}  // namespace

std::string js_regex_to_icu(const std::string& input, const std::string& where) {
  std::string pattern = input;
  for (auto [from, to] : kJsRewrites) {
    for (size_t at = pattern.find(from); at != std::string::npos;
         at = pattern.find(from, at + to.size()))
      pattern.replace(at, from.size(), to);
  }
  auto fail = [&](const std::string& what) {
    MEMFIT_THROW(ConfigError, "tokenizer",
                 "{}: the regular expression '{}' has {}, which memfit cannot match as "
                 "JavaScript does", where, input, what);
  };
  std::string out;
  bool in_class = false, class_start = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    const bool at_class_start = class_start;
    class_start = false;
    if (c == '\\') {
      if (i + 1 >= pattern.size()) fail("a trailing backslash");
      const char e = pattern[++i];
      auto set = [&](std::string_view inside, bool negated) {
        if (negated || !in_class) out += negated ? "[^" : "[";  // ICU nests sets in sets
        out += inside;
        if (negated || !in_class) out += ']';
      };
      switch (e) {
        case 's': set(kJsSpace, false); break;
        case 'S': set(kJsSpace, true); break;
        case 'd': set(kJsDigit, false); break;
        case 'D': set(kJsDigit, true); break;
        case 'w': set(kJsWord, false); break;
        case 'W': set(kJsWord, true); break;
        case 'b': case 'B':
          if (!in_class) fail(std::string("\\") + e + " (JavaScript's ASCII word boundary)");
          out += "\\x08";  // [\b] is backspace
          break;
        case 'u':
          if (i + 1 < pattern.size() && pattern[i + 1] == '{') {
            out += "\\x";  // \u{1F600} is ICU's \x{1F600}
          } else {
            out += "\\u";
          }
          break;
        case '#': case '&': case '~': out += "\\"; out += e; break;  // escaped either way
        default:
          out += '\\';
          out += e;
          if ((e == 'p' || e == 'P') && i + 1 < pattern.size() && pattern[i + 1] == '{') {
            const size_t close = pattern.find('}', i);
            if (close == std::string::npos) fail("an unterminated \\p{...}");
            out.append(pattern, i + 1, close - i);
            i = close;
          }
      }
      continue;
    }
    if (in_class) {
      if (c == ']') {
        in_class = false;
        out += c;
      } else if (c == '^' && at_class_start) {
        out += c;
      } else if (c == '-' || std::isalnum(static_cast<unsigned char>(c)) ||
                 static_cast<unsigned char>(c) >= 0x80) {
        out += c;
      } else if (c == ' ') {
        out += "\\x20";
      } else {
        out += '\\';  // '[', '&', '$', '{', ':' ... are literal in a JavaScript class
        out += c;
      }
      continue;
    }
    if (c == '[') {
      in_class = true;
      class_start = true;
      out += c;
      continue;
    }
    if (c == '(' && i + 2 < pattern.size() && pattern[i + 1] == '?' &&
        std::isalpha(static_cast<unsigned char>(pattern[i + 2])))
      fail("an inline flag group (?" + std::string(1, pattern[i + 2]) + "...)");
    out += c;
  }
  if (in_class) fail("an unterminated character class");
  return out;
}

}  // namespace memfit::io
