// Loss masks in the model (docs/data.md, "Loss masks"): Transformer::forward_masked against the
// per-position cross-entropy of the model's own logits summed by hand over the masked-in
// positions; masked-out targets contribute nothing (change them and the loss and every
// gradient keep their bits); a row with no masked-in target contributes nothing either (change
// its tokens and the gradients keep their bits); an all-ones mask with dloss 1/N gives exactly
// what the unmasked forward gives. Both families, fp32 and the mixed routes.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "memfit/kernels/ref/crossentropy_ref.h"
#include "memfit/model/transformer.h"
#include "gpt2_test_util.h"

namespace memfit {
namespace {

using namespace gpt2_test;

struct MaskMode {
  const char* name;
  Family family;
  PrecisionOptions precision;
  AttentionKind attention;
};

const MaskMode kMaskModes[] = {
    {"gpt2_fp32", Family::gpt2, {Precision::fp32, true}, AttentionKind::flash},
    {"llama_fp32", Family::llama, {Precision::fp32, true}, AttentionKind::flash},
    {"gpt2_bf16", Family::gpt2, {Precision::bf16, true}, AttentionKind::flash},
    {"llama_bf16", Family::llama, {Precision::bf16, true}, AttentionKind::plain},
    {"gpt2_fp16", Family::gpt2, {Precision::fp16, true}, AttentionKind::plain},
};

class LossMask : public ::testing::TestWithParam<MaskMode> {
 protected:
  static constexpr int B = 2, T = 11;
  void SetUp() override {
    const MaskMode& m = GetParam();
    config_ = odd_config(m.family);
    gpt_ = std::make_unique<Transformer>(config_, pool_, m.precision);
    gpt_->init_weights(7);
    ActivationOptions o;
    o.attention = m.attention;
    gpt_->reserve(B, T, o);
    mask_ = Tensor::empty(pool_, {B, T}, DType::u8, Category::staging, "mask");
  }
  void set_mask(const std::vector<uint8_t>& m) {
    ASSERT_EQ(m.size(), size_t{B * T});
    std::memcpy(mask_.data<uint8_t>(), m.data(), m.size());
  }
  // The loss and the whole gradient slab of one training micro-batch.
  std::pair<float, std::vector<float>> step(const Batch& b, bool masked, float dloss) {
    gpt_->zero_grad();
    const float loss = masked ? gpt_->forward_masked(b.tokens, b.targets, mask_, true, dloss)
                              : gpt_->forward(b.tokens, b.targets, true);
    gpt_->backward();
    const float* g = gpt_->grads().data<float>();
    return {loss, std::vector<float>(g, g + gpt_->grads().numel())};
  }

  MemoryPool pool_;
  ModelConfig config_;
  std::unique_ptr<Transformer> gpt_;
  Tensor mask_;
};

// Row 0: a prompt of 4 targets then 7 trained; row 1: 2 trained in the middle.
std::vector<uint8_t> sample_mask() {
  std::vector<uint8_t> m(22, 0);
  for (int t = 4; t < 11; ++t) m[t] = 1;
  m[11 + 5] = m[11 + 6] = 1;
  return m;
}

TEST_P(LossMask, SumIsTheMaskedPositionsCrossEntropyByHand) {
  Batch b(pool_, B, T, config_.vocab_size, 3);
  const std::vector<uint8_t> m = sample_mask();
  set_mask(m);
  const float sum = gpt_->forward_masked(b.tokens, b.targets, mask_, false, 0);
  Tensor logits = Tensor::empty(pool_, {B, T, config_.vocab_size}, DType::f32,
                                Category::staging, "logits");
  gpt_->logits(b.tokens, logits);
  std::vector<double> x(logits.data<float>(), logits.data<float>() + logits.numel());
  std::vector<double> losses(B * T);
  const int64_t V = config_.vocab_size;
  kernels::ref::crossentropy_forward_ref(losses.data(), x.data(), b.targets.data<int32_t>(),
                                         B * T, V, V, m.data());
  double want = 0;
  for (double l : losses) want += l;
  EXPECT_NEAR(sum, want, 2e-3 * want) << "masked sum against the reference over the logits";
  // The masked-out positions' losses are really left out: the unmasked sum differs.
  const float all = gpt_->forward(b.tokens, b.targets, false) * B * T;
  EXPECT_GT(std::abs(all - sum), 1.0f);
}

TEST_P(LossMask, MaskedOutTargetsChangeNoLossAndNoGradientBit) {
  Batch b(pool_, B, T, config_.vocab_size, 5);
  const std::vector<uint8_t> m = sample_mask();
  set_mask(m);
  const float dloss = 1.0f / 9;  // nine masked-in targets
  const auto [loss0, grads0] = step(b, true, dloss);
  int32_t* y = b.targets.data<int32_t>();
  for (int i = 0; i < B * T; ++i)
    if (!m[i]) y[i] = (y[i] + 1 + i) % config_.vocab_size;  // every prompt target changed
  const auto [loss1, grads1] = step(b, true, dloss);
  EXPECT_EQ(loss1, loss0);
  ASSERT_EQ(grads1.size(), grads0.size());
  EXPECT_EQ(std::memcmp(grads1.data(), grads0.data(), grads0.size() * sizeof(float)), 0)
      << "a masked-out target changed a gradient bit";
  // And a masked-in target does change them (the test can fail).
  y[5] = (y[5] + 1) % config_.vocab_size;
  const auto [loss2, grads2] = step(b, true, dloss);
  EXPECT_NE(loss2, loss0);
  EXPECT_NE(std::memcmp(grads2.data(), grads0.data(), grads0.size() * sizeof(float)), 0);
}

TEST_P(LossMask, ARowWithNoMaskedInTargetContributesNothing) {
  // Row 0 holds a whole record's prompt with nothing to train; row 1 trains three targets.
  std::vector<uint8_t> m(B * T, 0);
  m[T + 2] = m[T + 3] = m[T + 9] = 1;
  set_mask(m);
  Batch b(pool_, B, T, config_.vocab_size, 9);
  const auto [loss0, grads0] = step(b, true, 1.0f / 3);
  int32_t* x = b.tokens.data<int32_t>();
  int32_t* y = b.targets.data<int32_t>();
  for (int t = 0; t < T; ++t) {  // row 0's inputs and targets all changed
    x[t] = (x[t] + 3 + t) % config_.vocab_size;
    y[t] = (y[t] + 5 + t) % config_.vocab_size;
  }
  const auto [loss1, grads1] = step(b, true, 1.0f / 3);
  EXPECT_EQ(loss1, loss0);
  EXPECT_EQ(std::memcmp(grads1.data(), grads0.data(), grads0.size() * sizeof(float)), 0);
  // No masked-in target at all: loss 0, every gradient 0.
  set_mask(std::vector<uint8_t>(B * T, 0));
  const auto [loss2, grads2] = step(b, true, 1.0f);
  EXPECT_EQ(loss2, 0.0f);
  for (float g : grads2) ASSERT_EQ(g, 0.0f);
}

TEST_P(LossMask, AllOnesWithOneOverNIsTheUnmaskedStepBitForBit) {
  Batch b(pool_, B, T, config_.vocab_size, 11);
  set_mask(std::vector<uint8_t>(B * T, 1));
  const float N = static_cast<float>(B * T);
  const auto [loss0, grads0] = step(b, false, 0);
  const auto [loss1, grads1] = step(b, true, 1.0f / N);
  EXPECT_EQ(loss1 / N, loss0);
  EXPECT_EQ(std::memcmp(grads1.data(), grads0.data(), grads0.size() * sizeof(float)), 0);
}

INSTANTIATE_TEST_SUITE_P(Modes, LossMask, ::testing::ValuesIn(kMaskModes),
                         [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace memfit
