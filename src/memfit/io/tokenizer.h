// Tokenizer: the one interface the data pipeline, the trainer and `memfit sample` use to turn
// text into token ids and back, so GPT-2 BPE and the plain byte tokenizer are interchangeable.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace memfit::io {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Appends the ids of `text` (any bytes; UTF-8 expected) to `out`.
  virtual void encode_append(std::string_view text, std::vector<int32_t>& out) const = 0;
  // The bytes the ids stand for. Throws Error for an id outside [0, vocab_size()).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // Ids are in [0, vocab_size()).
  virtual int32_t vocab_size() const = 0;
  // The id that separates documents in a token stream (GPT-2: 50256, <|endoftext|>).
  virtual int32_t eot_token() const = 0;
  // "gpt2" or "byte": the name make_tokenizer takes.
  virtual std::string_view name() const = 0;

  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> out;
    encode_append(text, out);
    return out;
  }
};

// The tokenizer called `name` ("gpt2" or "byte"). `vocab_dir` is where GPT-2's encoder.json and
// vocab.bpe lie; empty means find_gpt2_vocab_dir(). Throws ConfigError for an unknown name and
// IoError when the vocabulary files are missing or malformed.
std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name,
                                          const std::filesystem::path& vocab_dir = {});

}  // namespace memfit::io
