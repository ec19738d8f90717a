// The tokenizer factory: the one place that knows every tokenizer by name.
#include "memfit/io/tokenizer/tokenizer.h"

#include "memfit/core/error.h"
#include "memfit/io/tokenizer/byte_tokenizer.h"
#include "memfit/io/tokenizer/gpt2_tokenizer.h"
#include "memfit/io/tokenizer/hf_tokenizer.h"

namespace memfit::io {

bool is_tokenizer_json_path(std::string_view name) {
  return name.ends_with(".json") || name.find('/') != std::string_view::npos;
}

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name,
                                          const std::filesystem::path& vocab_dir) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  if (name == "gpt2")
    return std::make_unique<Gpt2Tokenizer>(vocab_dir.empty() ? find_gpt2_vocab_dir() : vocab_dir);
  if (name == "llama2" || name == "llama3")
    return std::make_unique<HfTokenizer>(find_hf_tokenizer_json(name), std::string(name));
  if (is_tokenizer_json_path(name))
    return std::make_unique<HfTokenizer>(std::filesystem::path(name), std::string(name));
  MEMFIT_THROW(ConfigError, "tokenizer",
               "unknown tokenizer '{}'; expected gpt2, llama2, llama3, byte or the path of a "
               "tokenizer.json", name);
}

}  // namespace memfit::io
