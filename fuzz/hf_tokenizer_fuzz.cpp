// libFuzzer harness for Hugging Face tokenizer.json files (io/tokenizer/hf_tokenizer.h: the JSON
// model, normalizer, pre-tokenizer and decoder readers, byte-level and SentencePiece-style BPE). An
// accepted file must encode text (ASCII, UTF-8, special-token look-alikes) to ids inside its
// vocabulary and decode them without failing.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "memfit/core/error.h"
#include "memfit/io/tokenizer/hf_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memfit;
  const auto path = fuzz::write_scratch("tokenizer.json", fuzz::as_text(data, size));
  try {
    io::HfTokenizer tok(path, "fuzz");
    for (const char* text : {"Hello world", " ab  ba\n\t12345 <s></s>", "\xc3\xa9t\xc3\xa9 \xe2\x96\x81x"}) {
      const std::vector<int32_t> ids = tok.encode(text);
      for (int32_t id : ids)
        if (id < 0 || id >= tok.vocab_size()) __builtin_trap();
      (void)tok.decode(ids);
    }
  } catch (const Error&) {
  }
  return 0;
}
