// The byte tokenizer: ids are byte values.
#include "memfit/io/tokenizer/byte_tokenizer.h"

#include "memfit/core/error.h"

namespace memfit::io {

void ByteTokenizer::encode_append(std::string_view text, std::vector<int32_t>& out) const {
  for (char c : text) out.push_back(static_cast<uint8_t>(c));
}

std::string ByteTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (int32_t id : ids) {
    MEMFIT_CHECK(id >= 0 && id < 256, "byte", "token id {} is outside the vocabulary [0, 256)", id);
    out.push_back(static_cast<char>(id));
  }
  return out;
}

}  // namespace memfit::io
