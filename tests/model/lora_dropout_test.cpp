// LoRA dropout (model/lora_dropout.h, Note [LoRA], "Dropout"): the counter-based mask keeps
// about 1 - p of the elements, scales them by exactly 1/(1 - p), and depends on the key and the
// element alone (a chunk of rows draws what the whole draws); in a model, a training step with
// p > 0 is deterministic for a draw and changes with it, evaluation runs without dropout (its
// logits are p = 0's bit for bit), the adapters' gradients match finite differences of the loss
// with the mask fixed, and a recomputed block (--ckpt full) draws the same mask.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "memfit/model/lora.h"
#include "memfit/model/lora_dropout.h"
#include "memfit/model/transformer.h"

namespace memfit {
namespace {

TEST(LoraDropoutMask, KeepsAboutOneMinusPScaledByItsInverse) {
  const int64_t rows = 100, n = 1000;
  std::vector<float> ones(rows * n, 1.0f), out(rows * n);
  for (const float p : {0.05f, 0.1f, 0.5f, 0.9f}) {
    const uint64_t key = lora_dropout_key(lora_dropout_draw(1337, 3, 1), 2, LinearSlot::qkv, 1);
    lora_dropout_rows(out.data(), ones.data(), 0, rows, n, p, key);
    int64_t kept = 0;
    const float scale = 1.0f / (1.0f - p);
    for (int64_t i = 0; i < rows * n; ++i) {
      ASSERT_TRUE(out[i] == 0.0f || out[i] == scale) << out[i];
      kept += out[i] != 0.0f;
      ASSERT_EQ(out[i] != 0.0f, lora_dropout_keeps(key, i, p));
    }
    // 1e5 Bernoulli draws: the standard deviation of the fraction is below 0.0016.
    EXPECT_NEAR(static_cast<double>(kept) / static_cast<double>(rows * n), 1.0 - p, 0.01) << p;
  }
}

TEST(LoraDropoutMask, DependsOnTheKeyAndTheElementAlone) {
  const int64_t rows = 7, n = 33;
  std::vector<float> x(rows * n), whole(rows * n), part(3 * n), other(rows * n);
  for (int64_t i = 0; i < rows * n; ++i) x[i] = 0.25f + static_cast<float>(i);
  const uint64_t draw = lora_dropout_draw(1, 2, 0);
  const uint64_t key = lora_dropout_key(draw, 0, LinearSlot::fc, 0);
  lora_dropout_rows(whole.data(), x.data(), 0, rows, n, 0.3f, key);
  lora_dropout_rows(part.data(), x.data() + 4 * n, 4, 3, n, 0.3f, key);  // rows 4..6 alone
  EXPECT_EQ(std::memcmp(part.data(), whole.data() + 4 * n, part.size() * sizeof(float)), 0);
  // Every other coordinate of the draw changes the mask.
  for (const uint64_t k :
       {lora_dropout_key(draw, 1, LinearSlot::fc, 0), lora_dropout_key(draw, 0, LinearSlot::mlp_out, 0),
        lora_dropout_key(draw, 0, LinearSlot::fc, 1),
        lora_dropout_key(lora_dropout_draw(1, 3, 0), 0, LinearSlot::fc, 0),
        lora_dropout_key(lora_dropout_draw(1, 2, 1), 0, LinearSlot::fc, 0),
        lora_dropout_key(lora_dropout_draw(2, 2, 0), 0, LinearSlot::fc, 0),
        lora_dropout_key(lora_dropout_draw(1, 2, 0, 1), 0, LinearSlot::fc, 0)}) {  // data rank 1
    lora_dropout_rows(other.data(), x.data(), 0, rows, n, 0.3f, k);
    EXPECT_NE(std::memcmp(other.data(), whole.data(), whole.size() * sizeof(float)), 0);
  }
  // The backward's masked add is the same mask: dst += dropout(src).
  std::vector<float> acc(rows * n, 1.0f);
  lora_dropout_add_rows(acc.data(), x.data(), 0, rows, n, 0.3f, key);
  for (int64_t i = 0; i < rows * n; ++i) EXPECT_EQ(acc[i], 1.0f + whole[i]);
}

ModelConfig tiny(Family f) {
  ModelConfig c;
  c.family = f;
  c.n_layer = 2;
  c.n_head = 2;
  c.d_model = 16;
  c.max_seq_len = 8;
  c.vocab_size = 40;
  if (f == Family::llama) {
    c.n_kv_head = 1;
    c.ffn_dim = 24;
  }
  c.finalize();
  return c;
}

class LoraDropoutModel : public ::testing::TestWithParam<Family> {
 protected:
  static constexpr int B = 2, T = 8;
  void SetUp() override {
    config = tiny(GetParam());
    tokens = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "tokens");
    targets = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "targets");
    for (int64_t i = 0; i < B * T; ++i) {
      tokens.data<int32_t>()[i] = static_cast<int32_t>((7 * i + 3) % config.vocab_size);
      targets.data<int32_t>()[i] = static_cast<int32_t>((5 * i + 1) % config.vocab_size);
    }
  }
  // A model with adapters on every linear layer, B drawn nonzero so that A has a gradient.
  std::unique_ptr<Transformer> model(float p, const char* ckpt = "none") {
    auto m = std::make_unique<Transformer>(config, pool);
    m->init_weights(3);
    LoraOptions o;
    o.rank = 4;
    o.alpha = 8;
    o.dropout = p;
    m->add_lora(o, 5);
    std::mt19937 gen(9);
    std::normal_distribution<float> normal(0.0f, 0.1f);
    for (const LoraParam& lp : m->lora()->params())
      for (int64_t i = 0; i < lp.out * o.rank; ++i)
        m->lora_weights().data<float>()[lp.b_offset + i] = normal(gen);
    ActivationOptions options;
    options.ckpt = CheckpointPolicy::parse(ckpt);
    m->reserve(B, T, options);
    return m;
  }
  std::vector<float> grads(Transformer& m, uint64_t draw) {
    m.set_lora_dropout_draw(draw);
    m.zero_grad();
    m.forward(tokens, targets, true);
    m.backward();
    const float* g = m.lora_grads().data<float>();
    return {g, g + m.lora()->total()};
  }
  std::vector<float> logits(Transformer& m) {
    Tensor out =
        Tensor::empty(pool, {B, T, config.vocab_size}, DType::f32, Category::staging, "logits");
    m.logits(tokens, out);
    return {out.data<float>(), out.data<float>() + out.numel()};
  }

  MemoryPool pool;
  ModelConfig config;
  Tensor tokens, targets;
};

TEST_P(LoraDropoutModel, AStepIsDeterministicForADrawAndEvaluationRunsWithout) {
  auto m = model(0.3f);
  auto plain = model(0.0f);
  const std::vector<float> a = grads(*m, 11), again = grads(*m, 11), other = grads(*m, 12);
  const std::vector<float> none = grads(*plain, 11);
  EXPECT_EQ(std::memcmp(a.data(), again.data(), a.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(a.data(), other.data(), a.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(a.data(), none.data(), a.size() * sizeof(float)), 0);
  m->set_lora_dropout_draw(11);
  plain->set_lora_dropout_draw(11);
  const std::vector<float> lm = logits(*m), lp = logits(*plain);
  EXPECT_EQ(std::memcmp(lm.data(), lp.data(), lm.size() * sizeof(float)), 0);
  // An evaluation forward's loss, too, is the model's without dropout.
  EXPECT_EQ(m->forward(tokens, targets, false), plain->forward(tokens, targets, false));
}

TEST_P(LoraDropoutModel, RecomputedBlocksDrawTheSameMask) {
  auto kept = model(0.3f), recomputed = model(0.3f, "full");
  const std::vector<float> a = grads(*kept, 21), b = grads(*recomputed, 21);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

// Central differences of the training loss (the mask fixed by its draw) in double steps of
// 1e-2 on f32 weights: the relative error is dominated by the loss's f32 rounding, so 2e-2 of
// the larger gradients, over elements of A and B of every adapter.
TEST_P(LoraDropoutModel, AdapterGradientsMatchFiniteDifferencesWithTheMaskFixed) {
  auto m = model(0.4f);
  const uint64_t draw = 31;
  const std::vector<float> g = grads(*m, draw);
  float* w = m->lora_weights().data<float>();
  auto loss = [&] {
    m->set_lora_dropout_draw(draw);
    const float l = m->forward(tokens, targets, true);
    m->backward();  // keeps the model's forward/backward pairing; the gradients are not read
    return static_cast<double>(l);
  };
  int checked = 0;
  for (const LoraParam& lp : m->lora()->params())
    for (const int64_t at : {lp.a_offset + 1, lp.a_offset + lp.in + 2, lp.b_offset + 3}) {
      if (std::abs(g[at]) < 1e-3f) continue;
      const float saved = w[at];
      const float eps = 1e-2f;
      w[at] = saved + eps;
      const double up = loss();
      w[at] = saved - eps;
      const double down = loss();
      w[at] = saved;
      const double fd = (up - down) / (2.0 * eps);
      EXPECT_NEAR(fd, g[at], 2e-2 * std::abs(g[at]) + 1e-4) << lp.module << " element " << at;
      ++checked;
    }
  EXPECT_GE(checked, 8);
}

INSTANTIATE_TEST_SUITE_P(Families, LoraDropoutModel, ::testing::Values(Family::gpt2, Family::llama),
                         [](const auto& info) { return std::string(family_name(info.param)); });

}  // namespace
}  // namespace memfit
