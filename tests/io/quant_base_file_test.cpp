// A save's quantized base file (io/checkpoint/quant_base_file.h), NF4 and int8: the bytes come
// back as they were, and a file of another model's shape or of the other format is an IoError
// naming the file and the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "memfit/core/error.h"
#include "memfit/io/checkpoint/quant_base_file.h"

namespace memfit {
namespace {

ModelConfig tiny(int d_model) {
  ModelConfig c;
  c.family = Family::llama;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_model = d_model;
  c.ffn_dim = 96;
  c.max_seq_len = 16;
  c.vocab_size = 100;
  c.finalize();
  return c;
}

using kernels::WeightQuant;

TEST(QuantBaseFile, RoundTripsByteForByteAndRefusesAnotherShapeOrFormat) {
  for (const WeightQuant format : {WeightQuant::nf4, WeightQuant::int8}) {
    const std::string name(kernels::weight_quant_name(format));
    SCOPED_TRACE(name);
    const std::filesystem::path file =
        std::filesystem::temp_directory_path() /
        ("memfit_" + name + "_base_" + std::to_string(::getpid()) + ".safetensors");
    MemoryPool pool;
    const QuantBaseLayout layout(tiny(64), format);
    const auto n = static_cast<int64_t>(layout.bytes());
    Tensor a = Tensor::empty(pool, {n}, DType::u8, Category::staging, "a");
    Tensor b = Tensor::empty(pool, {n}, DType::u8, Category::staging, "b");
    for (int64_t i = 0; i < n; ++i) a.data<uint8_t>()[i] = static_cast<uint8_t>(i * 131 + 7);
    std::memset(b.raw_data(), 0, static_cast<size_t>(n));
    io::save_quant_base(file, layout, a);
    io::load_quant_base(file, layout, b);
    EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(n)), 0);
    const QuantBaseLayout other(tiny(128), format);
    Tensor c = Tensor::empty(pool, {static_cast<int64_t>(other.bytes())}, DType::u8,
                             Category::staging, "c");
    try {
      io::load_quant_base(file, other, c);
      ADD_FAILURE() << "another model's base loaded";
    } catch (const IoError& e) {
      EXPECT_NE(std::string(e.what()).find("model.layers.0.qkv." + name), std::string::npos)
          << e.what();
    }
    // The same model in the other format: its tensors are not in the file.
    const QuantBaseLayout swapped(
        tiny(64), format == WeightQuant::nf4 ? WeightQuant::int8 : WeightQuant::nf4);
    Tensor d = Tensor::empty(pool, {static_cast<int64_t>(swapped.bytes())}, DType::u8,
                             Category::staging, "d");
    EXPECT_THROW(io::load_quant_base(file, swapped, d), IoError);
    std::filesystem::remove(file);
  }
  EXPECT_EQ(io::quant_base_file(WeightQuant::nf4), "base_nf4.safetensors");
  EXPECT_EQ(io::quant_base_file(WeightQuant::int8), "base_int8.safetensors");
}

}  // namespace
}  // namespace memfit
