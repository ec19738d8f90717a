// Split pre-tokenizers and JavaScript white space; see hf_pretokenize.h.
#include "memfit/io/hf_pretokenize.h"

#include <unicode/uchar.h>
#include <unicode/utext.h>
#include <unicode/utf8.h>

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

}  // namespace memfit::io
