// A QLoRA save's NF4 base file (io/checkpoint/nf4_base_file.h): the bytes come back as they
// were, and a file of another model's shape is an IoError naming the file and the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "memfit/core/error.h"
#include "memfit/io/checkpoint/nf4_base_file.h"

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

TEST(Nf4BaseFile, RoundTripsByteForByteAndRefusesAnotherShape) {
  const std::filesystem::path file =
      std::filesystem::temp_directory_path() /
      ("memfit_nf4_base_" + std::to_string(::getpid()) + ".safetensors");
  MemoryPool pool;
  const Nf4BaseLayout layout(tiny(64));
  const auto n = static_cast<int64_t>(layout.bytes());
  Tensor a = Tensor::empty(pool, {n}, DType::u8, Category::staging, "a");
  Tensor b = Tensor::empty(pool, {n}, DType::u8, Category::staging, "b");
  for (int64_t i = 0; i < n; ++i) a.data<uint8_t>()[i] = static_cast<uint8_t>(i * 131 + 7);
  std::memset(b.raw_data(), 0, static_cast<size_t>(n));
  io::save_nf4_base(file, layout, a);
  io::load_nf4_base(file, layout, b);
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), static_cast<size_t>(n)), 0);
  const Nf4BaseLayout other(tiny(128));
  Tensor c = Tensor::empty(pool, {static_cast<int64_t>(other.bytes())}, DType::u8,
                           Category::staging, "c");
  try {
    io::load_nf4_base(file, other, c);
    ADD_FAILURE() << "another model's NF4 base loaded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.qkv.nf4"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove(file);
}

}  // namespace
}  // namespace memfit
