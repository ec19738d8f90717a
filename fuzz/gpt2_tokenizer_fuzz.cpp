// libFuzzer harness for GPT-2's vocabulary files (io/tokenizer/gpt2_tokenizer.h). One input holds
// both: encoder.json, then a line "---- vocab.bpe ----", then vocab.bpe (without it, vocab.bpe is
// empty). A tokenizer the files make then encodes and decodes a few strings, which must round
// trip, so merges that the reader let through but that break BPE show up too.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "memfit/core/error.h"
#include "memfit/io/tokenizer/gpt2_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memfit;
  constexpr std::string_view kSeparator = "\n---- vocab.bpe ----\n";
  const std::string_view input = fuzz::as_text(data, size);
  const size_t cut = input.find(kSeparator);
  const std::string_view encoder = input.substr(0, cut);
  const std::string_view merges =
      cut == std::string_view::npos ? std::string_view() : input.substr(cut + kSeparator.size());
  fuzz::write_scratch("encoder.json", encoder);
  fuzz::write_scratch("vocab.bpe", merges);
  try {
    io::Gpt2Tokenizer tok(fuzz::scratch_dir());
    for (std::string_view text : {"hello world", "  aaaa  bbbb\n\n", "héllo <|endoftext|> 123"}) {
      std::vector<int32_t> ids;
      tok.encode_append(text, ids);
      if (tok.decode(ids) != text) __builtin_trap();
    }
  } catch (const Error&) {
  }
  return 0;
}
