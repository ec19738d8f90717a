// What each block keeps for its backward, read from the step plan (plan/block_activations.h),
// against a count made here from the GPT-2 block's description (model/gpt2/gpt2_block.cpp): the
// two LayerNorms' statistics (f32), qkv, the attention output and the GELU input (in the half
// type), the residual stream twice (f32), and flash attention's log-sum-exp or plain attention's
// probabilities; a rank's slice under --tp; the segment's output alone under full
// recomputation. The figures Note [Activation memory] sets beside Korthikanti et al.'s.
#include "memfit/plan/block_activations.h"

#include <gtest/gtest.h>

namespace memfit {
namespace {

constexpr int B = 2, T = 32;

BlockActivations blocks(const ModelConfig& c, Precision p, AttentionKind a, const char* ckpt) {
  ActivationOptions o;
  o.precision = p;
  o.attention = a;
  o.ckpt = CheckpointPolicy::parse(ckpt);
  return block_activations(plan_step(c, B, T, o), c.n_layer);
}

TEST(BlockActivations, EveryKeptBlockHoldsWhatItsDescriptionSaves) {
  ModelConfig c = ModelConfig::preset("gpt2-tiny");  // 2 blocks, width 96, 4 heads
  const int64_t N = B * T, C = c.d_model, NH = c.n_head;
  for (int tp : {1, 2, 4}) {
    ModelConfig m = c;
    if (tp > 1) m.set_tensor_parallel(tp);
    // bytes per token: the statistics 16, the residual stream 8C, the rank's q|k|v 3C/tp,
    // attention output C/tp and GELU input 4C/tp at h bytes each, and 4 bytes a local head.
    auto want = [&](int64_t h, int64_t attention) {
      return N * (16 + 8 * C + h * (3 * C + C + 4 * C) / tp) + attention;
    };
    const int64_t lse = N * 4 * (NH / tp);
    const BlockActivations f32 = blocks(m, Precision::fp32, AttentionKind::flash, "none");
    const BlockActivations bf = blocks(m, Precision::bf16, AttentionKind::flash, "none");
    ASSERT_EQ(f32.per_block.size(), 2u);
    for (int64_t b : f32.per_block) EXPECT_EQ(b, want(4, lse)) << tp;
    for (int64_t b : bf.per_block) EXPECT_EQ(b, want(2, lse)) << tp;
    EXPECT_EQ(bf.buffers.at("qkv"), N * 2 * 3 * C / tp);
    EXPECT_EQ(bf.buffers.at("fch"), N * 2 * 4 * C / tp);
    EXPECT_EQ(bf.buffers.at("residual_2"), N * 4 * C);
    EXPECT_EQ(bf.buffers.at("lse"), lse);
    EXPECT_EQ(bf.buffers.count("ln_1"), 0u);  // recomputed (Note [Recomputed norms])
    // Plain attention keeps each block's (T, T) probabilities per head, in the half type;
    // selective recomputes them from one shared block's worth, which is no block's.
    const int64_t probs = int64_t{B} * (NH / tp) * T * T * 2;
    for (int64_t b : blocks(m, Precision::bf16, AttentionKind::plain, "none").per_block)
      EXPECT_EQ(b, want(2, probs)) << tp;
    for (int64_t b : blocks(m, Precision::bf16, AttentionKind::plain, "selective").per_block)
      EXPECT_EQ(b, want(2, 0)) << tp;
    // Full recomputation: each block keeps its output (the next one's input), f32.
    for (int64_t b : blocks(m, Precision::bf16, AttentionKind::flash, "full").per_block)
      EXPECT_EQ(b, N * 4 * C) << tp;
  }
}

}  // namespace
}  // namespace memfit
