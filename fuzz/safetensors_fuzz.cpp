// libFuzzer harness for the safetensors reader (io/checkpoint/safetensors.h): the whole file is the
// input, so the length prefix, the JSON header and the data section are all fuzzed. Every tensor
// the reader accepts is then read, so an offset it let through that points outside the mapping
// shows up as an AddressSanitizer report.
#include <cstddef>
#include <cstdint>

#include "fuzz/fuzz_util.h"
#include "memfit/core/error.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/memory/pool.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memfit;
  const auto path = fuzz::write_scratch("model.safetensors", fuzz::as_text(data, size));
  try {
    io::SafetensorsReader reader(path);
    uint64_t sum = 0;
    for (const io::SafetensorsEntry& e : reader.entries()) {
      const std::byte* p = reader.bytes(e);
      for (uint64_t i = 0; i < e.nbytes(); ++i) sum += static_cast<uint8_t>(p[i]);
      // Small float tensors through the converting read too (F32/BF16/F16 -> f32).
      const int64_t n = e.numel();
      if (n > 0 && n <= 4096 && e.shape.size() <= Shape::kMaxRank && memfit_dtype_of(e.dtype)) {
        Shape shape;
        for (int64_t d : e.shape) shape.push_back(d);
        MemoryPool pool;
        Tensor dst = Tensor::empty(pool, shape, DType::f32, Category::staging, "fuzz");
        try {
          reader.read(e, dst);
        } catch (const Error&) {
        }
      }
    }
    (void)reader.find("wte.weight");
    if (sum == 1) return 0;  // keeps the loop
  } catch (const Error&) {
  }
  return 0;
}
