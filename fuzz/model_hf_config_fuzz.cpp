// libFuzzer harness for any Hugging Face config.json memfit reads (io/hf/model_hf_config.h: GPT-2's
// GPT2Config or LLaMA's LlamaConfig, told apart by architectures / model_type), read from a
// file as a checkpoint's is; an accepted config is written back and read again, which must agree.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "memfit/core/error.h"
#include "memfit/io/hf/model_hf_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memfit;
  const auto path = fuzz::write_scratch("config.json", fuzz::as_text(data, size));
  try {
    const ModelConfig config = io::read_model_config(path);
    const auto again_path =
        fuzz::write_scratch("again.json", io::model_config_to_hf_json(config).dump());
    if (!(io::read_model_config(again_path) == config)) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
