// The NF4 base's layout and streamed quantization (model/nf4_base.h): LLaMA-3 8B's block
// linears take 4.127 bits a weight (0.516 bytes), the count Note [NF4 weights] gives; the
// matrices lie where the model's typed views put them; and quantizing from the layout's values
// a few rows at a time gives kernels::nf4_quantize's bytes of each whole matrix, bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include <fmt/format.h>

#include "memfit/kernels/cpu/nf4.h"
#include "memfit/model/nf4_base.h"
#include "memfit/model/transformer.h"

namespace memfit {
namespace {

TEST(Nf4BaseLayout, Llama3_8bLinearsTakeAboutHalfAByteAWeight) {
  const ModelConfig c = ModelConfig::preset("llama3-8b");
  const Nf4BaseLayout l(c);
  ModelConfig f = c;
  f.finalize();
  EXPECT_EQ(l.numel(), int64_t{f.n_layer} * f.block_matmul_params());
  EXPECT_EQ(l.matrices().size(), 32u * kLinearSlots);
  const double per = double(l.bytes()) / double(l.numel());
  EXPECT_NEAR(per, (4.0 + 8.0 / 64 + 32.0 / (64 * 256)) / 8, 1e-5);
  // q|k|v of LLaMA-3 8B: (4096 + 2 x 1024) x 4096; gate|up 2 x 14336.
  EXPECT_EQ(l.matrix(3, LinearSlot::qkv).rows, 6144);
  EXPECT_EQ(l.matrix(3, LinearSlot::fc).rows, 2 * 14336);
  EXPECT_EQ(l.matrix(3, LinearSlot::mlp_out).cols, 14336);
}

TEST(Nf4BaseQuantize, StreamedRowsAreTheWholeMatrixQuantizedBitForBit) {
  for (const Family fam : {Family::gpt2, Family::llama}) {
    SCOPED_TRACE(family_name(fam));
    ModelConfig c;
    c.family = fam;
    c.n_layer = 2;
    c.n_head = 4;
    c.d_model = 32;  // 32 columns: a piece is an even number of rows
    c.max_seq_len = 16;
    c.vocab_size = 100;
    if (fam == Family::llama) {
      c.n_kv_head = 2;
      c.ffn_dim = 80;
    }
    c.finalize();
    MemoryPool pool;
    Transformer m(c, pool);
    m.init_weights(9);
    const Nf4BaseLayout l(c);
    const ModelWeights views = m.layout().views(m.params());
    Tensor buffer = Tensor::empty(pool, {static_cast<int64_t>(l.bytes())}, DType::u8,
                                  Category::params, "nf4");
    Tensor piece = Tensor::empty(pool, {400}, DType::f32, Category::staging, "piece");
    Tensor absmax = Tensor::empty(pool, {static_cast<int64_t>(l.quantize_scratch_bytes() / 4)},
                                  DType::f32, Category::staging, "absmax");
    const float* params = m.params().data<float>();
    int calls = 0;
    nf4_base_quantize(
        l, buffer,
        [&](int64_t from, int64_t to, float* dst) {
          ++calls;
          std::memcpy(dst, params + from, static_cast<size_t>(to - from) * sizeof(float));
        },
        piece, absmax);
    EXPECT_GT(calls, static_cast<int>(l.matrices().size()));  // several pieces a matrix
    for (const Nf4Matrix& mx : l.matrices()) {
      const BlockWeights& b = views.blocks[static_cast<size_t>(mx.layer)];
      const Tensor& want_w = mx.slot == LinearSlot::qkv        ? b.qkv_w
                             : mx.slot == LinearSlot::attn_out ? b.attn_out_w
                             : mx.slot == LinearSlot::fc       ? b.fc_w
                                                               : b.mlp_out_w;
      ASSERT_EQ(want_w.shape(), (Shape{mx.rows, mx.cols}));
      EXPECT_EQ(want_w.data<float>(), params + mx.layout_offset);
      const auto bytes = static_cast<int64_t>(kernels::nf4_bytes(mx.rows, mx.cols));
      Tensor want = Tensor::empty(pool, {bytes}, DType::u8, Category::staging, "want");
      kernels::Nf4Weight ww = kernels::Nf4Weight::view(want, mx.rows, mx.cols);
      Tensor scratch = Tensor::empty(
          pool, {static_cast<int64_t>(kernels::nf4_quantize_scratch_bytes(mx.rows, mx.cols) / 4)},
          DType::f32, Category::staging, "s");
      kernels::nf4_quantize(want_w, ww, scratch);
      EXPECT_EQ(std::memcmp(static_cast<const std::byte*>(buffer.raw_data()) + mx.at,
                            want.raw_data(), want.nbytes()),
                0)
          << "layer " << mx.layer << " slot " << int(mx.slot);
    }
  }
}

}  // namespace
}  // namespace memfit
