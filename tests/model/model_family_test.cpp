// The family tables (model/model_family.h): each answers for its own Family, and what the
// skeleton, the planner and the log read from them is what the code decided per family before
// the tables existed (names, widths, the fixed GPT-2 shape, the rotary head-size check, the
// descriptions, the residual initialisation).
#include "memfit/model/model_family.h"

#include <gtest/gtest.h>

#include <cmath>

#include "memfit/core/error.h"
#include "memfit/model/family_compute.h"

namespace memfit {
namespace {

TEST(ModelFamily, EachTableAnswersForItsOwnFamily) {
  for (Family f : {Family::gpt2, Family::llama}) {
    const ModelFamily& m = model_family(f);
    EXPECT_EQ(m.id, f);
    EXPECT_EQ(family_name(f), m.name);
    EXPECT_NE(family_compute(f).block_forward, nullptr);
    EXPECT_NE(family_compute(f).final_norm_backward, nullptr);
  }
  EXPECT_EQ(family_name(Family::gpt2), "gpt2");
  EXPECT_EQ(family_name(Family::llama), "llama");
  EXPECT_EQ(model_family(Family::gpt2).display_name, "GPT-2");
  EXPECT_EQ(model_family(Family::llama).display_name, "LLaMA");
  EXPECT_STREQ(model_family(Family::gpt2).final_norm_tag, "ln_f");
  EXPECT_STREQ(model_family(Family::llama).final_norm_tag, "norm");
}

TEST(ModelFamily, WidthsAndDescriptionsAreTheFamilies) {
  const ModelConfig g = ModelConfig::preset("gpt2");
  EXPECT_EQ(g.fc_width(), 4 * 768);
  EXPECT_EQ(g.block_matmul_params(), 12 * 768 * 768);
  EXPECT_EQ(g.describe(),
            "12 layers, 12 heads, width 768, context 1024, vocab 50257 (padded 50304)");
  const ModelConfig l = ModelConfig::preset("llama-tiny");
  EXPECT_EQ(l.fc_width(), 2 * 256);
  EXPECT_EQ(l.describe(),
            "LLaMA: 2 layers, 4 heads (2 key/value), width 96, MLP 256, context 64, vocab 512 "
            "(padded 512), untied head");
}

// Hugging Face's counts of the published checkpoints (no biases, untied heads, the vocabulary
// 128,256 already a multiple of 64): per block 2 d^2 + 2 d kv + 3 d f + 2 d, plus 2 V d and the
// final norm. 70B: 80 x 855,654,400 + 2,101,346,304 + 8,192; 405B: 126 x 3,187,703,808 +
// 4,202,692,608 + 16,384.
TEST(ModelFamily, LlamaThreePresetsHaveThePublishedShapesAndCounts) {
  EXPECT_EQ(ModelConfig::preset("llama3-8b").num_params(), 8'030'261'248);
  const ModelConfig l70 = ModelConfig::preset("llama3-70b");
  EXPECT_EQ(l70.num_params(), 70'553'706'496);
  EXPECT_EQ(l70.describe(),
            "LLaMA: 80 layers, 64 heads (8 key/value), width 8192, MLP 28672, context 8192, "
            "vocab 128256 (padded 128256), untied head");
  EXPECT_EQ(l70.rope_theta, 500000);
  const ModelConfig l405 = ModelConfig::preset("llama3.1-405b");
  EXPECT_EQ(l405.num_params(), 405'853'388'800);
  EXPECT_EQ(l405.describe(),
            "LLaMA: 126 layers, 128 heads (8 key/value), width 16384, MLP 53248, context 131072, "
            "vocab 128256 (padded 128256), untied head");
  EXPECT_EQ(l405.rope_theta, 500000);
  EXPECT_EQ(l405.rope_scaling.factor, 8);
}

TEST(ModelFamily, GptTwoFixesItsShapeAndRotaryNeedsAnEvenHead) {
  ModelConfig g = ModelConfig::preset("gpt2-tiny");
  g.n_kv_head = 2;
  g.ffn_dim = 7;
  g.tie_embeddings = false;
  g.finalize();
  EXPECT_EQ(g.n_kv_head, g.n_head);
  EXPECT_EQ(g.ffn_dim, 4 * g.d_model);
  EXPECT_TRUE(g.tie_embeddings);
  // 6 heads of 15: odd, which rotary positions cannot take and learned ones can.
  g.n_head = 6;
  g.d_model = 90;
  EXPECT_NO_THROW(g.finalize());
  ModelConfig l = ModelConfig::preset("llama-tiny");
  l.n_head = 6;
  l.n_kv_head = 6;
  l.d_model = 90;
  EXPECT_THROW(l.finalize(), ConfigError);
}

TEST(ModelFamily, OnlyGptTwoScalesItsResidualProjections) {
  const ModelConfig g = ModelConfig::preset("gpt2");
  EXPECT_EQ(model_family(g.family).residual_init_scale(g), 1.0 / std::sqrt(2.0 * 12));
  const ModelConfig l = ModelConfig::preset("llama-tiny");
  EXPECT_EQ(model_family(l.family).residual_init_scale(l), 1.0);
}

}  // namespace
}  // namespace memfit
