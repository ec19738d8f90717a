// memfit's LLaMA against PyTorch: the fixture (tests/reference/make_llama_fixture.py, Hugging
// Face's LlamaForCausalLM written out in PyTorch float64, with grouped-query attention and an
// untied head) holds weights, one batch, logits, loss, every gradient and the parameters after 3
// AdamW steps with weight decay. Loss within 1e-5; every logit block, gradient and parameter
// within 1e-4 relative (norm of the difference over norm of the reference), with flash and plain
// attention. Measured far inside the bounds (flash; plain alike): each loss equal to PyTorch's
// rounded to f32, logits 2.6e-7, worst gradient 6.5e-7 (layers.1 k_proj), worst parameter after
// AdamW 1.1e-7 (LLaMA has no key bias, whose zero gradient FP32 leaves as noise; see GPT-2).
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

const char* kFixture = MEMFIT_SOURCE_DIR "/tests/reference/llama_fixture.safetensors";

using reference_test::rel_error;

class LlamaReference : public reference_test::ReferenceFixture {
 protected:
  LlamaReference() : ReferenceFixture(kFixture) {}
  void SetUp() override {
    ASSERT_EQ(file.metadata().at("family"), "llama");
    config.family = Family::llama;
    config.n_layer = int(meta("n_layer"));
    config.n_head = int(meta("n_head"));
    config.n_kv_head = int(meta("n_kv_head"));
    config.d_model = int(meta("d_model"));
    config.ffn_dim = int(meta("ffn_dim"));
    config.max_seq_len = int(meta("max_seq_len"));
    config.vocab_size = int(meta("vocab_size"));
    config.rope_theta = meta("rope_theta");
    config.norm_eps = float(meta("norm_eps"));
    config.tie_embeddings = meta("tie_embeddings") != 0;
    config.finalize();
    read_step();
  }
};

TEST_P(LlamaReference, LossLogitsGradientsAndThreeAdamWStepsMatchPyTorch) {
  Transformer llama(config, pool);
  size_t stored = 0;  // the fixture holds every parameter of memfit's layout, and no other
  for (const io::SafetensorsEntry& e : file.entries()) stored += e.name.rfind("param.", 0) == 0;
  ASSERT_EQ(stored, llama.layout().params().size());
  for (const ParamInfo& p : llama.layout().params())
    file.read("param." + p.name, llama.param(p.name));
  ActivationOptions options;
  options.attention = GetParam();
  llama.reserve(B, T, options);
  Tensor tokens = load("tokens", {B, T}, DType::i32), targets = load("targets", {B, T}, DType::i32);
  Tensor losses = load("losses", {steps});

  Tensor logits = Tensor::empty(pool, {B, T, config.vocab_size}, DType::f32, Category::staging, "l");
  llama.logits(tokens, logits);
  const double logits_err = rel_error(logits, load("logits", {B, T, config.vocab_size}));
  EXPECT_LT(logits_err, 1e-4);

  AdamW opt(optim, llama.layout(), pool);
  double worst_loss = 0, worst_grad = 0, worst_param = 0;
  std::string worst_grad_name, worst_param_name;
  for (int s = 0; s < steps; ++s) {
    llama.zero_grad();
    float loss = llama.forward(tokens, targets, /*training=*/true);
    llama.backward();
    EXPECT_NEAR(loss, losses.data<float>()[s], 1e-5) << "step " << s;
    worst_loss = std::max(worst_loss, std::abs(double(loss) - losses.data<float>()[s]));
    if (s == 0) {
      for (const ParamInfo& p : llama.layout().params()) {
        double e = rel_error(llama.grad(p.name), load("grad." + p.name, p.shape));
        if (e > worst_grad) worst_grad = e, worst_grad_name = p.name;
        EXPECT_LT(e, 1e-4) << "gradient of " << p.name;
      }
    }
    opt.step(llama.params(), llama.grads(), lr, 1.0f);
  }
  for (const ParamInfo& p : llama.layout().params()) {
    double e = rel_error(llama.param(p.name), load("after." + p.name, p.shape));
    if (e > worst_param) worst_param = e, worst_param_name = p.name;
    EXPECT_LT(e, 1e-4) << "parameter " << p.name << " after " << steps << " AdamW steps";
  }
  std::printf(
      "worst error: loss %.2e absolute; relative: logits %.2e, gradient %.2e (%s), parameter "
      "after %d steps %.2e (%s)\n",
      worst_loss, logits_err, worst_grad, worst_grad_name.c_str(), steps, worst_param,
      worst_param_name.c_str());
}

INSTANTIATE_TEST_SUITE_P(Attention, LlamaReference,
                         ::testing::Values(AttentionKind::flash, AttentionKind::plain),
                         [](const auto& info) { return std::string(attention_kind_name(info.param)); });

}  // namespace
}  // namespace memfit
