// 4-bit AdamW's state over a layout: which tensors are quantised and how (rank-1 scales for
// matrices), the bytes (exact and predicted), cuts only at whole matrices, and a step that
// dequantises to within the maps' bounds of double-precision AdamW from the same state.
#include "memfit/optim/adamw4bit.h"

#include <gtest/gtest.h>

#include "memfit/kernels/cpu/quant4.h"
#include "optim_test_util.h"

namespace memfit {
namespace {

TEST(AdamW4bitState, MatricesGetRank1ScalesAndTheRestBlocks) {
  const ParamLayout layout(testing::odd_config());
  const QuantizedStateLayout v(layout, AdamW4bit::second_moment_format());
  const QuantizedStateLayout m(layout, AdamW4bit::first_moment_format());
  int64_t rowcol = 0, blocks = 0;
  for (size_t i = 0; i < layout.params().size(); ++i) {
    const ParamInfo& p = layout.params()[i];
    SCOPED_TRACE(p.name);
    EXPECT_EQ(v.slot(i).quantized, p.numel >= 4096);
    EXPECT_EQ(v.slot(i).rank1, p.numel >= 4096 && p.shape.rank() == 2);
    EXPECT_FALSE(m.slot(i).rank1);
    if (v.slot(i).rank1) {
      EXPECT_EQ(v.slot(i).scale, rowcol);
      rowcol += (p.shape[0] + p.shape[1] + 15) / 16 * 16;
    }
    if (m.slot(i).quantized) blocks += (p.numel + 127) / 128;
  }
  EXPECT_EQ(v.rowcol_elements(), rowcol);
  EXPECT_EQ(v.absmax_elements(), 0);  // every quantised tensor here is a matrix
  EXPECT_EQ(m.blocks(), blocks);
  EXPECT_EQ(m.code_bytes(), blocks * 64);  // 128 codes, two a byte
  EXPECT_EQ(AdamW4bit::state_bytes_for(layout), m.bytes() + v.bytes());
}

TEST(AdamW4bitState, CutsOnlyAtWholeMatrices) {
  const ParamLayout layout(testing::odd_config());
  MemoryPool pool;
  OptimConfig c;
  c.name = "adamw4bit";
  AdamW4bit opt(c, layout, nullptr);
  for (const ParamInfo& p : layout.params()) {
    if (p.numel < 4096) continue;
    EXPECT_EQ(opt.next_cut(p.offset), p.offset) << p.name;
    EXPECT_EQ(opt.next_cut(p.offset + 1), p.offset + p.numel) << p.name;
    EXPECT_EQ(opt.next_cut(p.offset + 128), p.offset + p.numel) << p.name;
    // A range that ends inside the matrix is refused.
    EXPECT_THROW(make_optimizer(c, layout, nullptr, ElementRange{0, p.offset + 128}), Error);
  }
}

// State of a 1-D tensor of 4096 values or more (none in GPT-2's or LLaMA's layouts) is
// block-wise for both moments: a LLaMA-like norm over a wide model.
TEST(AdamW4bitState, OneDimensionalTensorsAreBlockWise) {
  ModelConfig mc = ModelConfig::preset("llama-tiny");
  mc.d_model = 4096;
  mc.n_head = 32;
  mc.n_kv_head = 32;
  mc.ffn_dim = 64;
  mc.n_layer = 1;
  mc.vocab_size = 64;
  mc.finalize();
  const ParamLayout layout(mc);
  const QuantizedStateLayout v(layout, AdamW4bit::second_moment_format());
  int norms = 0;
  for (size_t i = 0; i < layout.params().size(); ++i) {
    const ParamInfo& p = layout.params()[i];
    if (p.shape.rank() != 1) continue;
    ++norms;
    EXPECT_TRUE(v.slot(i).quantized) << p.name;
    EXPECT_FALSE(v.slot(i).rank1) << p.name;
    EXPECT_EQ(v.next_cut(p.offset + 1), p.offset + 128) << p.name;
  }
  EXPECT_GE(norms, 2);
  EXPECT_EQ(v.absmax_elements(), (norms * 32 + 15) / 16 * 16);
}

TEST(AdamW4bit, OneStepIsAdamWFromTheDequantisedState) {
  testing::Slabs s(testing::odd_config());
  OptimConfig c;
  c.name = "adamw4bit";
  AdamW4bit opt(c, s.layout, s.pool);
  s.fill_grads(4);
  std::vector<double> p = s.params_copy();
  const float lr = 1e-2f;
  // From zero state the first step is exactly AdamW's: m = (1-b1) g, v = (1-b2) g^2.
  for (const ParamInfo& pi : s.layout.params()) {
    testing::AdamRef r{lr, c.beta1, c.beta2, c.eps, pi.decay ? c.weight_decay : 0.0};
    for (int64_t k = 0; k < pi.numel; ++k) {
      double m = 0, v = 0;
      testing::adamw_ref(p[pi.offset + k], s.grads.data<float>()[pi.offset + k], m, v, r, 1);
    }
  }
  opt.step(s.params, s.grads, lr, 1.0f);
  testing::expect_all_close(s.params.data<float>(), p.data(), s.layout.total(), 2e-6, 1e-6,
                            "params");
}

TEST(AdamW4bit, PureBf16WeightsAreRefused) {
  testing::Slabs s(testing::odd_config());
  OptimConfig c;
  c.name = "adamw4bit";
  AdamW4bit opt(c, s.layout, s.pool);
  EXPECT_FALSE(opt.updates_bf16_weights());
  Tensor w = Tensor::empty(s.pool, {s.layout.total()}, DType::bf16, Category::params, "w");
  EXPECT_THROW(opt.step(w, s.grads, 1e-3f, 1.0f), DTypeError);
}

}  // namespace
}  // namespace memfit
