// GPT-2's pre-tokenizer: the regular expression that cuts text into the pieces BPE merges
// within. Written out by hand (no regex engine) over ICU's Unicode categories, so it is exact,
// linear in the text and needs no Unicode-aware regex library. See docs/data.md.
#pragma once

#include <string_view>
#include <vector>

namespace memfit::io {

// Appends to `out` the pieces of `text` that GPT-2's pattern
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// matches, in order, as views into `text`; together they cover `text` exactly.
// \p{L} and \p{N} are the Unicode general categories L* and N* (ICU). \s is JavaScript's \s
// (the oracle in tests/io/ is the gpt-3-encoder npm package): Unicode Zs plus \t \n \v \f \r,
// U+2028, U+2029 and U+FEFF. Bytes that are not valid UTF-8 are kept, each ill-formed sequence
// counting as one character that is neither letter, number nor space.
void gpt2_pretokenize(std::string_view text, std::vector<std::string_view>& out);

}  // namespace memfit::io
