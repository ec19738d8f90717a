// A quantized base's layout and streamed quantization (model/quant_base.h), NF4 and int8:
// LLaMA-3 8B's block linears take 4.127 bits a weight as NF4 (0.516 bytes, the count Note [NF4
// weights] gives) and 1 byte + 4 per row as int8; the matrices lie where the model's typed
// views put them; and quantizing from the layout's values a few rows at a time gives the
// format's bytes of each whole matrix (kernels::quant_quantize), bit for bit.
#include <gtest/gtest.h>

#include <cstring>

#include <fmt/format.h>

#include "memfit/kernels/cpu/quant_weight.h"
#include "memfit/model/quant_base.h"
#include "memfit/model/transformer.h"

namespace memfit {
namespace {

using kernels::WeightQuant;

TEST(QuantBaseLayout, Llama3_8bLinearsTakeHalfAByteAsNf4AndAByteAsInt8) {
  const ModelConfig c = ModelConfig::preset("llama3-8b");
  ModelConfig f = c;
  f.finalize();
  for (const WeightQuant q : {WeightQuant::nf4, WeightQuant::int8}) {
    const QuantBaseLayout l(c, q);
    EXPECT_EQ(l.format(), q);
    EXPECT_EQ(l.numel(), int64_t{f.n_layer} * f.block_matmul_params());
    EXPECT_EQ(l.matrices().size(), 32u * kLinearSlots);
    // q|k|v of LLaMA-3 8B: (4096 + 2 x 1024) x 4096; gate|up 2 x 14336.
    EXPECT_EQ(l.matrix(3, LinearSlot::qkv).rows, 6144);
    EXPECT_EQ(l.matrix(3, LinearSlot::fc).rows, 2 * 14336);
    EXPECT_EQ(l.matrix(3, LinearSlot::mlp_out).cols, 14336);
  }
  const QuantBaseLayout nf4(c, WeightQuant::nf4), int8(c, WeightQuant::int8);
  EXPECT_NEAR(double(nf4.bytes()) / double(nf4.numel()), (4.0 + 8.0 / 64 + 32.0 / (64 * 256)) / 8,
              1e-5);
  EXPECT_GT(nf4.quantize_scratch_bytes(), 0u);
  // int8: every weight a byte, every row an f32 absmax (the widths are multiples of 4: no pad).
  size_t want = 0;
  for (const QuantMatrix& m : int8.matrices())
    want += static_cast<size_t>(m.rows * m.cols) + 4 * static_cast<size_t>(m.rows);
  EXPECT_EQ(int8.bytes(), want);
  EXPECT_EQ(int8.quantize_scratch_bytes(), 0u);
  EXPECT_EQ(int8.min_piece_elements(), 14336);  // one row of down_proj
}

TEST(QuantBaseQuantize, StreamedRowsAreTheWholeMatrixQuantizedBitForBit) {
  for (const WeightQuant q : {WeightQuant::nf4, WeightQuant::int8})
    for (const Family fam : {Family::gpt2, Family::llama}) {
      SCOPED_TRACE(fmt::format("{} {}", kernels::weight_quant_name(q), family_name(fam)));
      ModelConfig c;
      c.family = fam;
      c.n_layer = 2;
      c.n_head = 4;
      c.d_model = 32;  // 32 columns: an NF4 piece is an even number of rows
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
      const QuantBaseLayout l(c, q);
      const ModelWeights views = m.layout().views(m.params());
      Tensor buffer = Tensor::empty(pool, {static_cast<int64_t>(l.bytes())}, DType::u8,
                                    Category::params, "base");
      Tensor piece = Tensor::empty(pool, {400}, DType::f32, Category::staging, "piece");
      Tensor scratch;
      if (l.quantize_scratch_bytes() > 0)
        scratch = Tensor::empty(pool, {static_cast<int64_t>(l.quantize_scratch_bytes() / 4)},
                                DType::f32, Category::staging, "scratch");
      const float* params = m.params().data<float>();
      int calls = 0;
      quant_base_quantize(
          l, buffer,
          [&](int64_t from, int64_t to, float* dst) {
            ++calls;
            std::memcpy(dst, params + from, static_cast<size_t>(to - from) * sizeof(float));
          },
          piece, scratch);
      EXPECT_GT(calls, static_cast<int>(l.matrices().size()));  // several pieces a matrix
      for (const QuantMatrix& mx : l.matrices()) {
        const BlockWeights& b = views.blocks[static_cast<size_t>(mx.layer)];
        const Tensor& want_w = mx.slot == LinearSlot::qkv        ? b.qkv_w
                               : mx.slot == LinearSlot::attn_out ? b.attn_out_w
                               : mx.slot == LinearSlot::fc       ? b.fc_w
                                                                 : b.mlp_out_w;
        ASSERT_EQ(want_w.shape(), (Shape{mx.rows, mx.cols}));
        EXPECT_EQ(want_w.data<float>(), params + mx.layout_offset);
        const auto bytes = static_cast<int64_t>(l.matrix_bytes(mx));
        Tensor want = Tensor::empty(pool, {bytes}, DType::u8, Category::staging, "want");
        kernels::QuantWeight ww = kernels::QuantWeight::view(q, want.raw_data(), mx.rows, mx.cols);
        const auto s = static_cast<int64_t>(
            kernels::quant_quantize_scratch_bytes(q, mx.rows, mx.cols) / 4);
        Tensor ws = Tensor::empty(pool, {std::max<int64_t>(s, 1)}, DType::f32, Category::staging,
                                  "s");
        kernels::quant_quantize(want_w, ww, ws);
        EXPECT_EQ(std::memcmp(static_cast<const std::byte*>(buffer.raw_data()) + mx.at,
                              want.raw_data(), want.nbytes()),
                  0)
            << "layer " << mx.layer << " slot " << int(mx.slot);
      }
    }
}

}  // namespace
}  // namespace memfit
