// libFuzzer harness for Hugging Face GPT-2 config.json files (io/hf/gpt2_hf_config.h), read from a
// file as a checkpoint's is; an accepted config is written back and read again, which must agree.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "memfit/core/error.h"
#include "memfit/io/hf/gpt2_hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memfit;
  const auto path = fuzz::write_scratch("config.json", fuzz::as_text(data, size));
  try {
    const ModelConfig config = io::read_gpt2_config(path);
    const ModelConfig again = io::gpt2_config_from_hf_json(io::gpt2_config_to_hf_json(config), "again");
    if (!(again == config)) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
