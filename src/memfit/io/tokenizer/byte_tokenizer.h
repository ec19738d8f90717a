// The byte tokenizer: each byte is its own token (vocabulary 256). No files to load, so tests and
// small experiments run anywhere; the id of a byte is the byte's value.
#pragma once

#include "memfit/io/tokenizer/tokenizer.h"

namespace memfit::io {

class ByteTokenizer final : public Tokenizer {
 public:
  // Documents are separated by byte 0 (NUL), which text files do not contain; the vocabulary
  // stays 256 so ids fit a byte.
  static constexpr int32_t kEndOfText = 0;

  void encode_append(std::string_view text, std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return 256; }
  int32_t eot_token() const override { return kEndOfText; }
  std::string_view name() const override { return "byte"; }
};

}  // namespace memfit::io
