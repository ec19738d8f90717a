// Which tensors get 8-bit state and where: tensors of 4096 values or more get whole blocks of
// codes and one absmax each, smaller ones FP32; slabs are whole 64-byte lines.
#include "memfit/optim/quantized_state.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "memfit/kernels/cpu/blockwise_quant.h"
#include "optim_test_util.h"

namespace memfit {
namespace {

TEST(QuantizedStateLayout, SmallTensorsKeepFp32) {
  ModelConfig gc = testing::odd_config();
  ParamLayout layout(gc);
  QuantizedStateLayout q(layout);
  int64_t blocks = 0, f32 = 0;
  for (size_t i = 0; i < layout.params().size(); ++i) {
    const ParamInfo& p = layout.params()[i];
    const auto& s = q.slot(i);
    EXPECT_EQ(s.quantized, p.numel >= 4096) << p.name;
    if (s.quantized) {
      EXPECT_EQ(s.offset, blocks) << p.name;
      blocks += (p.numel + 255) / 256;
    } else {
      EXPECT_EQ(s.offset, f32) << p.name;
      f32 += (p.numel + 15) / 16 * 16;
    }
  }
  EXPECT_EQ(q.blocks(), blocks);
  EXPECT_EQ(q.f32_elements(), f32);
  EXPECT_EQ(q.code_bytes(), blocks * 256);
  EXPECT_EQ(q.absmax_elements() % 16, 0);
  EXPECT_EQ(q.bytes(), static_cast<size_t>(blocks * 256 + q.absmax_elements() * 4 + f32 * 4));
  // Odd config: wte, wpe, c_attn, c_proj, c_fc, mlp c_proj are quantised; 4 LayerNorm tensors,
  // 4 biases and ln_f's two are not.
  EXPECT_TRUE(q.slot(0).quantized);
  EXPECT_FALSE(q.slot(2).quantized);  // h.0.ln_1.weight
}

TEST(QuantizedStateLayout, ThresholdIs4096Values) {
  // wpe is (max_seq_len, 64): 4096 values are quantised, 4032 are not.
  for (int seq : {64, 63}) {
    ModelConfig gc;
    gc.n_layer = 1;
    gc.n_head = 2;
    gc.d_model = 64;
    gc.max_seq_len = seq;
    gc.vocab_size = 64;
    gc.finalize();
    ParamLayout layout(gc);
    ASSERT_EQ(layout.params()[1].name, "wpe.weight");
    EXPECT_EQ(QuantizedStateLayout(layout).slot(1).quantized, seq * 64 >= 4096) << seq;
  }
}

// position() as its header defines it, by a walk over every tensor: inside a tensor of the
// part, its slot plus what lies before x; else the slot of the next tensor of the part after x,
// or the part's end.
int64_t position_by_walk(const ParamLayout& layout, const QuantizedStateLayout& q,
                         QuantizedStateLayout::Part part, int64_t x) {
  using Part = QuantizedStateLayout::Part;
  for (size_t i = 0; i < layout.params().size(); ++i) {
    const ParamInfo& p = layout.params()[i];
    if (p.offset + p.numel <= x || q.slot(i).quantized != (part != Part::f32)) continue;
    const int64_t inside = std::max<int64_t>(0, x - p.offset), slot = q.slot(i).offset;
    return part == Part::codes    ? slot * 256 + inside
           : part == Part::absmax ? slot + (inside + 255) / 256
                                  : slot + inside;
  }
  return part == Part::codes    ? q.code_bytes()
         : part == Part::absmax ? q.absmax_elements()
                                : q.f32_elements();
}

TEST(QuantizedStateLayout, PositionIsTheWalksAtEveryBoundaryAndBetween) {
  // Both mix the parts: small norm weights and biases between quantised matrices.
  ModelConfig llama = ModelConfig::preset("llama-tiny");
  llama.finalize();
  for (const ModelConfig& mc : {testing::odd_config(), llama}) {
    const ParamLayout layout(mc);
    const QuantizedStateLayout q(layout);
    std::vector<int64_t> xs = {0, layout.total()};
    for (const ParamInfo& p : layout.params())
      for (int64_t x : {p.offset, p.offset + 1, p.offset + p.numel / 2, p.offset + p.numel - 1,
                        p.offset + p.numel})
        xs.push_back(x);
    for (auto part : {QuantizedStateLayout::Part::codes, QuantizedStateLayout::Part::absmax,
                      QuantizedStateLayout::Part::f32})
      for (int64_t x : xs)
        ASSERT_EQ(q.position(part, x), position_by_walk(layout, q, part, x))
            << "part " << int(part) << " at element " << x << " of " << layout.total();
  }
}

TEST(QuantizedState, EmptyPartsAreLeftOut) {
  MemoryPool pool;
  ParamLayout mixed(testing::odd_config());
  Lion8bit opt(OptimConfig{.name = "lion8bit"}, mixed, pool);
  const auto st = opt.state();
  ASSERT_EQ(st.size(), 3u);
  EXPECT_EQ(st[0].first, "m.codes");
  EXPECT_EQ(st[1].first, "m.absmax");
  EXPECT_EQ(st[2].first, "m.f32");
  EXPECT_EQ(opt.state_bytes(), pool.bytes_current());
  EXPECT_EQ(opt.state_bytes(), QuantizedStateLayout(mixed).bytes());

  ModelConfig small;  // every tensor under 4096 values: FP32 state only
  small.n_layer = 1;
  small.n_head = 2;
  small.d_model = 8;
  small.max_seq_len = 8;
  small.vocab_size = 8;
  small.finalize();
  ParamLayout all_small(small);
  MemoryPool pool2;
  AdamW8bit opt2(OptimConfig{.name = "adamw8bit"}, all_small, pool2);
  const auto st2 = opt2.state();
  ASSERT_EQ(st2.size(), 2u);
  EXPECT_EQ(st2[0].first, "m.f32");
  EXPECT_EQ(st2[1].first, "v.f32");
  EXPECT_EQ(opt2.state_bytes(), pool2.bytes_current());
}

}  // namespace
}  // namespace memfit
