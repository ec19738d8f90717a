// The text-cutting steps of a tokenizer.json, with transformers.js's meaning: splitting at a
// regular expression (ICU's engine over UTF-8, the pattern translated by js_regex_to_icu) or a
// literal string, and JavaScript's notion of white space for trimming around added tokens.
#pragma once

#include <unicode/regex.h>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace memfit::io {

// JavaScript's \s: ECMA-262 WhiteSpace and LineTerminator (Unicode Zs, \t \n \v \f \r, U+2028,
// U+2029, U+FEFF), which String.prototype.trim uses too.
bool js_is_space(int32_t c);
// `s` less its leading (trim_start) or trailing (trim_end) JavaScript white space.
std::string_view js_trim_start(std::string_view s);
std::string_view js_trim_end(std::string_view s);

// A JavaScript regular expression (as transformers.js compiles a tokenizer.json "Regex" pattern,
// with its rewrites of Python-only syntax) as an ICU regular expression that matches the same
// strings: \s, \S, \d, \w and their negations spelled out as JavaScript defines them, a literal
// '[' and set operators inside classes escaped. Throws ConfigError naming `where` for syntax with
// no faithful translation (\b, \B, inline flags).
std::string js_regex_to_icu(const std::string& pattern, const std::string& where);

// One Split pre-tokenizer: cuts pieces of text at the matches of a pattern.
class TextSplitter {
 public:
  // `pattern` is an ICU regular expression (from js_regex_to_icu) or, with `literal`, a string.
  // `invert` keeps only the matches; `removed` keeps only the text between them; otherwise both
  // are kept, in order ("Isolated"). Empty pieces are dropped. Throws ConfigError naming `where`
  // if ICU rejects the pattern.
  TextSplitter(const std::string& pattern, bool literal, bool invert, bool removed,
               const std::string& where);
  ~TextSplitter();

  // Appends the pieces of `text` to `out` as views into `text`. Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  std::string literal_;                          // literal pattern, or empty
  std::unique_ptr<icu::RegexPattern> regex_;     // regular expression, or null
  bool invert_, removed_;
};

}  // namespace memfit::io
