// libFuzzer harness for the JSONL chat and instruction records `memfit prepare --format
// chat|instruct` reads (io/data/chat_record.h): the bytes as a file of records in both formats;
// every accepted record is rendered by the chatml and plain templates with the byte tokenizer
// (io/data/chat_template.h), whose tokens and mask must line up, hold only 0s and 1s, and train
// at least one token (every accepted record has an assistant message with its end token).
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "memfit/core/error.h"
#include "memfit/io/data/chat_record.h"
#include "memfit/io/data/chat_template.h"
#include "memfit/io/tokenizer/byte_tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memfit;
  const auto path = fuzz::write_scratch("records.jsonl", fuzz::as_text(data, size));
  static const io::ByteTokenizer tokenizer;
  static const io::ChatTemplate chatml(io::ChatTemplateKind::chatml, tokenizer);
  static const io::ChatTemplate plain(io::ChatTemplateKind::plain, tokenizer);
  for (io::ChatFormat format : {io::ChatFormat::chat, io::ChatFormat::instruct}) {
    try {
      for (const io::ChatRecord& r : io::read_chat_records(path, format))
        for (const io::ChatTemplate* t : {&chatml, &plain}) {
          std::vector<int32_t> ids;
          std::vector<uint8_t> mask;
          t->render(r, ids, mask);
          if (ids.size() != mask.size() || ids.empty() || mask[0] != 0) __builtin_trap();
          size_t trained = 0;
          for (uint8_t m : mask) {
            if (m > 1) __builtin_trap();
            trained += m;
          }
          if (trained == 0) __builtin_trap();
        }
    } catch (const Error&) {
    }
  }
  return 0;
}
