// memfit's GPT-2 against PyTorch: the fixture (tests/reference/make_gpt2_fixture.py, computed by
// PyTorch in float64) holds weights, one batch, logits, loss, every gradient and the parameters
// after 3 AdamW steps with weight decay. Loss within 1e-5; every logit block, gradient and
// parameter within 1e-4 relative (norm of the difference over norm of the reference).
// The parameters after AdamW come closest to the bound (3e-5 plain, 7e-5 flash, c_attn.bias):
// the key third of that bias has an identically zero gradient (softmax ignores a constant added
// to every score of a row), so FP32 leaves rounding noise of ~1e-11 there where PyTorch's float64
// has ~1e-18, and Adam's normalisation m / (sqrt(v) + eps) turns that noise into a visible step.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>

#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/model/transformer.h"
#include "memfit/optim/adamw.h"
#include "reference_test_util.h"

namespace memfit {
namespace {

const char* kFixture = MEMFIT_SOURCE_DIR "/tests/reference/gpt2_fixture.safetensors";

using reference_test::rel_error;

class GPT2Reference : public reference_test::ReferenceFixture {
 protected:
  GPT2Reference() : ReferenceFixture(kFixture) {}
  void SetUp() override {
    config.n_layer = int(meta("n_layer"));
    config.n_head = int(meta("n_head"));
    config.d_model = int(meta("d_model"));
    config.max_seq_len = int(meta("max_seq_len"));
    config.vocab_size = int(meta("vocab_size"));
    config.finalize();
    read_step();
  }
};

TEST_P(GPT2Reference, LossLogitsGradientsAndThreeAdamWStepsMatchPyTorch) {
  Transformer gpt(config, pool);
  for (const ParamInfo& p : gpt.layout().params()) file.read("param." + p.name, gpt.param(p.name));
  ActivationOptions options;
  options.attention = GetParam();
  gpt.reserve(B, T, options);
  Tensor tokens = load("tokens", {B, T}, DType::i32), targets = load("targets", {B, T}, DType::i32);
  Tensor losses = load("losses", {steps});

  Tensor logits = Tensor::empty(pool, {B, T, config.vocab_size}, DType::f32, Category::staging, "l");
  gpt.logits(tokens, logits);
  EXPECT_LT(rel_error(logits, load("logits", {B, T, config.vocab_size})), 1e-4);

  AdamW opt(optim, gpt.layout(), pool);
  double worst_grad = 0, worst_param = 0;
  for (int s = 0; s < steps; ++s) {
    gpt.zero_grad();
    float loss = gpt.forward(tokens, targets, /*training=*/true);
    gpt.backward();
    EXPECT_NEAR(loss, losses.data<float>()[s], 1e-5) << "step " << s;
    if (s == 0) {
      for (const ParamInfo& p : gpt.layout().params()) {
        double e = rel_error(gpt.grad(p.name), load("grad." + p.name, p.shape));
        worst_grad = std::max(worst_grad, e);
        EXPECT_LT(e, 1e-4) << "gradient of " << p.name;
      }
    }
    opt.step(gpt.params(), gpt.grads(), lr, 1.0f);
  }
  for (const ParamInfo& p : gpt.layout().params()) {
    double e = rel_error(gpt.param(p.name), load("after." + p.name, p.shape));
    worst_param = std::max(worst_param, e);
    EXPECT_LT(e, 1e-4) << "parameter " << p.name << " after " << steps << " AdamW steps";
  }
  std::printf("worst relative error: gradient %.2e, parameter after %d steps %.2e\n", worst_grad,
              steps, worst_param);
}

INSTANTIATE_TEST_SUITE_P(Attention, GPT2Reference,
                         ::testing::Values(AttentionKind::flash, AttentionKind::plain),
                         [](const auto& info) { return std::string(attention_kind_name(info.param)); });

}  // namespace
}  // namespace memfit
