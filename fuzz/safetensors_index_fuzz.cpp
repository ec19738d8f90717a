// libFuzzer harness for model.safetensors.index.json (io/checkpoint/sharded_safetensors.h): the
// input is the index of a sharded model whose two shard files exist beside it (tensors "a" and "b" in
// model-00001-of-00002.safetensors, "c" in model-00002-of-00002.safetensors). An accepted index
// must map every tensor it lists to a file that holds it.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "memfit/core/error.h"
#include "memfit/io/checkpoint/sharded_safetensors.h"

namespace {

// A safetensors file of F32 tensors of 2 values each: the 8-byte header length, the JSON
// header, the data.
std::string shard(std::initializer_list<const char*> names) {
  std::string header = "{";
  size_t offset = 0;
  for (const char* n : names) {
    if (header.size() > 1) header += ",";
    header += std::string("\"") + n + "\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[" +
              std::to_string(offset) + "," + std::to_string(offset + 8) + "]}";
    offset += 8;
  }
  header += "}";
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return out + header + std::string(offset, '\0');
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace memfit;
  static const bool shards_written = [] {
    fuzz::write_scratch("model-00001-of-00002.safetensors", shard({"a", "b"}));
    fuzz::write_scratch("model-00002-of-00002.safetensors", shard({"c"}));
    return true;
  }();
  (void)shards_written;
  const auto index =
      fuzz::write_scratch("model.safetensors.index.json", fuzz::as_text(data, size));
  try {
    io::ModelSafetensors model(index);
    for (const io::StoredTensor& t : model.tensors())
      if (model.find(t.entry->name) == nullptr) __builtin_trap();
  } catch (const Error&) {
  }
  return 0;
}
