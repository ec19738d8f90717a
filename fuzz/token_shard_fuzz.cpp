// libFuzzer harness for llm.c token shards (io/data/token_shard.h): the whole file is the input. A
// header the reader accepts is followed by reading the tokens with a vocabulary check, as the
// data loader does.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "memfit/core/error.h"
#include "memfit/io/data/token_shard.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memfit;
  const auto path = fuzz::write_scratch("train_000000.bin", fuzz::as_text(data, size));
  try {
    const int64_t count = io::read_token_shard_header(path);
    if (count > (1 << 20)) return 0;  // the size check passed, so this is the file's own length
    std::vector<uint16_t> tokens(static_cast<size_t>(count));
    io::read_token_shard_into(path, tokens, /*vocab_size=*/512);
  } catch (const Error&) {
  }
  return 0;
}
