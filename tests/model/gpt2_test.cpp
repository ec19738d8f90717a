// GPT-2 model behaviour: memory accounting against the step plan, gradient accumulation
// across micro-batches, the padded vocabulary, and the typed errors of bad use.
#include "memfit/model/transformer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "memfit/optim/adamw.h"
#include "gpt2_test_util.h"

namespace memfit {
namespace {

using namespace gpt2_test;

TEST(Transformer, PoolHoldsExactlyParamsGradsAndThePlan) {
  MemoryPool pool;
  ModelConfig c = odd_config();
  EXPECT_EQ(c.padded_vocab, 128);
  Transformer gpt(c, pool);
  gpt.reserve(2, 11);
  const StepPlan plan = plan_step(c, 2, 11, {});
  size_t slab = MemoryPool::round_up(c.num_params() * sizeof(float));
  EXPECT_EQ(pool.bytes_current(Category::params), slab);
  EXPECT_EQ(pool.bytes_current(Category::grads), slab);
  // One arena per category, smaller than its buffers laid end to end.
  for (Category cat : {Category::activations, Category::workspace}) {
    const size_t arena = plan.arena[static_cast<size_t>(cat)];
    EXPECT_EQ(pool.bytes_current(cat), arena) << category_name(cat);
    EXPECT_LE(arena, plan_bytes(plan.buffers, cat)) << category_name(cat);
  }
  EXPECT_LT(plan.arena[static_cast<size_t>(Category::workspace)],
            plan_bytes(plan.buffers, Category::workspace));
  Batch b(pool, 2, 11, c.vocab_size, 1);
  size_t before = pool.bytes_current();
  gpt.forward(b.tokens, b.targets, true);
  gpt.backward();
  EXPECT_EQ(pool.bytes_peak(), before) << "a training step allocated outside the plan";
}

TEST(Transformer, FlashAttentionSavesOneValuePerQueryRowInsteadOfTheScores) {
  ModelConfig c = ModelConfig::preset("gpt2");
  ActivationOptions flash, plain;
  plain.attention = AttentionKind::plain;
  const int B = 1, T = 1024;
  size_t f = plan_bytes(plan_step(c, B, T, flash).buffers, Category::activations);
  size_t p = plan_bytes(plan_step(c, B, T, plain).buffers, Category::activations);
  // plain keeps (B, NH, T, T) floats per layer, flash (B, NH, T)
  const size_t scores = size_t{4} * c.n_layer * c.n_head * B * T * T;
  const size_t lse = size_t{4} * c.n_layer * c.n_head * B * T;
  EXPECT_NEAR(double(p - f), double(scores - lse), 64.0 * c.n_layer);
  EXPECT_THROW(attention_kind_from_name("fast"), ConfigError);
}

TEST(Transformer, InitialLossIsNearLogVocab) {
  MemoryPool pool;
  ModelConfig c = odd_config();
  Transformer gpt(c, pool);
  gpt.init_weights(7);
  gpt.reserve(3, 16);
  Batch b(pool, 3, 16, c.vocab_size, 3);
  float loss = gpt.forward(b.tokens, b.targets, false);
  EXPECT_NEAR(loss, std::log(static_cast<float>(c.vocab_size)), 0.1);
}

TEST(Transformer, BackwardAccumulatesAcrossMicroBatches) {
  MemoryPool pool;
  ModelConfig c = odd_config();
  Transformer gpt(c, pool);
  gpt.init_weights(11);
  gpt.reserve(2, 8);
  Batch b(pool, 2, 8, c.vocab_size, 5);
  gpt.forward(b.tokens, b.targets, true);
  gpt.backward();
  std::vector<float> once(gpt.grads().data<float>(), gpt.grads().data<float>() + gpt.grads().numel());
  gpt.forward(b.tokens, b.targets, true);
  gpt.backward();
  const float* twice = gpt.grads().data<float>();
  double max_rel = 0;
  for (size_t i = 0; i < once.size(); ++i)
    if (once[i] != 0) max_rel = std::max(max_rel, std::abs(twice[i] / (2.0 * once[i]) - 1.0));
  EXPECT_LT(max_rel, 1e-5);
}

TEST(Transformer, PaddedVocabRowsGetNoGradientAndAreNeverPredicted) {
  MemoryPool pool;
  ModelConfig c = odd_config();
  Transformer gpt(c, pool);
  gpt.init_weights(13);
  gpt.reserve(2, 8);
  Batch b(pool, 2, 8, c.vocab_size, 9);
  gpt.forward(b.tokens, b.targets, true);
  gpt.backward();
  Tensor dwte = gpt.grad("wte.weight");
  const float* g = dwte.data<float>();
  double real = 0, padded = 0;
  for (int64_t r = 0; r < c.padded_vocab; ++r)
    for (int64_t j = 0; j < c.d_model; ++j)
      (r < c.vocab_size ? real : padded) += std::abs(g[r * c.d_model + j]);
  EXPECT_GT(real, 0.0);
  EXPECT_EQ(padded, 0.0);
  // Logits exist for real tokens only, and their softmax sums to one over them.
  Tensor logits = Tensor::empty(pool, {2, 8, c.vocab_size}, DType::f32, Category::workspace, "l");
  gpt.logits(b.tokens, logits);
  const float* l = logits.data<float>();
  double m = *std::max_element(l, l + c.vocab_size), z = 0;
  for (int v = 0; v < c.vocab_size; ++v) z += std::exp(l[v] - m);
  EXPECT_TRUE(std::isfinite(z) && z >= 1.0);
}

TEST(Transformer, LogitsMatchTheTrainingLoss) {
  MemoryPool pool;
  ModelConfig c = odd_config();
  Transformer gpt(c, pool);
  gpt.init_weights(17);
  gpt.reserve(2, 9);
  Batch b(pool, 2, 9, c.vocab_size, 21);
  Tensor logits = Tensor::empty(pool, {2, 9, c.vocab_size}, DType::f32, Category::workspace, "l");
  gpt.logits(b.tokens, logits);
  double sum = 0;
  for (int64_t n = 0; n < 18; ++n) {
    const float* row = logits.data<float>() + n * c.vocab_size;
    double m = *std::max_element(row, row + c.vocab_size), z = 0;
    for (int v = 0; v < c.vocab_size; ++v) z += std::exp(row[v] - m);
    sum += std::log(z) + m - row[b.targets.data<int32_t>()[n]];
  }
  EXPECT_NEAR(gpt.forward(b.tokens, b.targets, false), sum / 18, 1e-5);
}

TEST(Transformer, ABadBatchIsATypedError) {
  MemoryPool pool;
  ModelConfig c = odd_config();
  Transformer gpt(c, pool);
  EXPECT_THROW(gpt.reserve(1, 17), ShapeError);  // longer than the context
  gpt.reserve(2, 8);
  Batch wrong(pool, 2, 7, c.vocab_size, 1);
  try {
    gpt.forward(wrong.tokens, wrong.targets, true);
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("(2, 8)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(2, 7)"), std::string::npos) << msg;
  }
  Tensor floats = Tensor::empty(pool, {2, 8}, DType::f32, Category::staging, "f");
  Batch ok(pool, 2, 8, c.vocab_size, 1);
  EXPECT_THROW(gpt.forward(floats, ok.targets, true), DTypeError);
  ok.tokens.data<int32_t>()[3] = c.vocab_size;  // an id past the real vocabulary
  EXPECT_THROW(gpt.forward(ok.tokens, ok.targets, true), Error);
  EXPECT_THROW(gpt.backward(), Error);  // no training forward succeeded before it
}

TEST(Transformer, BudgetTooSmallForTheModelThrowsOutOfMemory) {
  ModelConfig c = ModelConfig::preset("gpt2");
  MemoryPool pool(parse_bytes("256MiB"));
  try {
    Transformer gpt(c, pool);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.category(), Category::params);
    EXPECT_GT(e.requested(), 256u << 20);
  }
}

TEST(Transformer, ConfigErrorsNameTheField) {
  ModelConfig c;
  c.d_model = 100;
  c.n_head = 3;
  try {
    c.finalize();
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("n_head"), std::string::npos);
  }
  EXPECT_THROW(ModelConfig::preset("gpt5"), ConfigError);
  // Counted by hand: wte V*C + wpe T*C + L*(12C^2 + 13C) + 2C (the final norm), the vocabulary
  // padded to a multiple of 64. GPT-2 small is Hugging Face's 124,439,808 at V = 50257, plus the
  // 47 padded rows of 768 (36,096); gpt2-tiny (V 512, T 64, C 96, L 2) is
  // 49,152 + 6,144 + 2 * 111,840 + 192.
  EXPECT_EQ(ModelConfig::preset("gpt2").num_params(), 124'439'808 + 47 * 768);
  EXPECT_EQ(ModelConfig::preset("gpt2-tiny").num_params(), 279'168);
}

}  // namespace
}  // namespace memfit
