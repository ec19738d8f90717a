// The tokenizer factory: the one place that knows every tokenizer by name.
#include "memfit/io/tokenizer.h"

#include "memfit/core/error.h"
#include "memfit/io/byte_tokenizer.h"
#include "memfit/io/gpt2_tokenizer.h"

namespace memfit::io {

std::unique_ptr<Tokenizer> make_tokenizer(std::string_view name,
                                          const std::filesystem::path& vocab_dir) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  if (name == "gpt2")
    return std::make_unique<Gpt2Tokenizer>(vocab_dir.empty() ? find_gpt2_vocab_dir() : vocab_dir);
  MEMFIT_THROW(ConfigError, "tokenizer", "unknown tokenizer '{}'; expected gpt2 or byte", name);
}

}  // namespace memfit::io
