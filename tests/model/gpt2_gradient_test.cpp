// The whole model's gradient by finite differences: a double-precision GPT-2 built from the
// reference kernels gives the loss; central differences of it, at sampled entries of every
// parameter tensor, must match the gradient memfit's FP32 backward computes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "memfit/kernels/ref/attention_ref.h"
#include "memfit/kernels/ref/crossentropy_ref.h"
#include "memfit/kernels/ref/embedding_ref.h"
#include "memfit/kernels/ref/gelu_ref.h"
#include "memfit/kernels/ref/layernorm_ref.h"
#include "memfit/kernels/ref/matmul_ref.h"
#include "memfit/kernels/ref/residual_ref.h"
#include "memfit/model/transformer.h"
#include "gradient_test_util.h"

namespace memfit {
namespace {

using namespace kernels::ref;

// Mean cross-entropy of GPT-2 in double precision, parameters laid out by `layout`.
double reference_loss(const ModelConfig& c, const ParamLayout& layout, const std::vector<double>& w,
                      const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                      int B, int T) {
  const int64_t N = int64_t{B} * T, C = c.d_model, Vp = c.padded_vocab;
  auto p = [&](const std::string& name) { return w.data() + layout.find(name).offset; };
  auto h = [&](int l, const char* what) { return p(fmt::format("h.{}.{}", l, what)); };
  std::vector<double> x(N * C), ln(N * C), mean(N), rstd(N), qkv(N * 3 * C),
      att(int64_t{B} * c.n_head * T * T), y(N * C), proj(N * C), fch(N * 4 * C), gel(N * 4 * C),
      logits(N * Vp), losses(N);
  embedding_forward_ref(x.data(), tokens.data(), p("wte.weight"), p("wpe.weight"), B, T, C);
  for (int l = 0; l < c.n_layer; ++l) {
    layernorm_forward_ref(ln.data(), mean.data(), rstd.data(), x.data(), h(l, "ln_1.weight"),
                          h(l, "ln_1.bias"), N, C);
    matmul_forward(qkv.data(), ln.data(), h(l, "attn.c_attn.weight"), h(l, "attn.c_attn.bias"), N,
                   C, 3 * C);
    attention_forward(y.data(), att.data(), qkv.data(), B, T, C, c.n_head);
    matmul_forward(proj.data(), y.data(), h(l, "attn.c_proj.weight"), h(l, "attn.c_proj.bias"), N,
                   C, C);
    residual_forward_ref(x.data(), x.data(), proj.data(), N * C);
    layernorm_forward_ref(ln.data(), mean.data(), rstd.data(), x.data(), h(l, "ln_2.weight"),
                          h(l, "ln_2.bias"), N, C);
    matmul_forward(fch.data(), ln.data(), h(l, "mlp.c_fc.weight"), h(l, "mlp.c_fc.bias"), N, C,
                   4 * C);
    gelu_forward_ref(gel.data(), fch.data(), N * 4 * C);
    matmul_forward(proj.data(), gel.data(), h(l, "mlp.c_proj.weight"), h(l, "mlp.c_proj.bias"), N,
                   4 * C, C);
    residual_forward_ref(x.data(), x.data(), proj.data(), N * C);
  }
  layernorm_forward_ref(ln.data(), mean.data(), rstd.data(), x.data(), p("ln_f.weight"),
                        p("ln_f.bias"), N, C);
  matmul_forward(logits.data(), ln.data(), p("wte.weight"), nullptr, N, C, Vp);
  crossentropy_forward_ref(losses.data(), logits.data(), targets.data(), N, Vp, c.vocab_size);
  double sum = 0;
  for (double v : losses) sum += v;
  return sum / N;
}

class GPT2Gradient : public ::testing::TestWithParam<AttentionKind> {};

TEST_P(GPT2Gradient, MatchesFiniteDifferencesOfADoublePrecisionReference) {
  ModelConfig c = ModelConfig::preset("gpt2-tiny");
  c.vocab_size = 300;  // not a multiple of 64: padded rows must stay out of it
  c.finalize();
  const int B = 2, T = 7;
  MemoryPool pool;
  Transformer gpt(c, pool);
  gpt.init_weights(99);
  std::mt19937 rng(5);
  gradient_test::add_noise(c, gpt.layout(), gpt.params(), rng);
  ActivationOptions options;
  options.attention = GetParam();
  gpt.reserve(B, T, options);
  gradient_test::RandomBatch batch(pool, B, T, c.vocab_size, rng);
  const std::vector<int32_t>& tok = batch.tok;
  const std::vector<int32_t>& tgt = batch.tgt;
  float loss = gpt.forward(batch.tokens, batch.targets, true);
  gpt.backward();

  std::vector<double> w(gpt.params().data<float>(), gpt.params().data<float>() + gpt.params().numel());
  const double ref_loss = reference_loss(c, gpt.layout(), w, tok, tgt, B, T);
  EXPECT_NEAR(loss, ref_loss, 1e-5);

  double worst = 0;
  for (const ParamInfo& p : gpt.layout().params()) {
    const auto [diff, norm] = gradient_test::finite_difference_error(
        p, gradient_test::real_numel(c, p), c.d_model, tok, w, gpt.grads().data<float>(), rng,
        [&] { return reference_loss(c, gpt.layout(), w, tok, tgt, B, T); });
    worst = std::max(worst, diff / (norm + 1e-12));
    EXPECT_LT(diff, 1e-4 * norm + 1e-8) << p.name;
  }
  std::printf("worst relative gradient error against finite differences: %.2e\n", worst);
}

INSTANTIATE_TEST_SUITE_P(Attention, GPT2Gradient,
                         ::testing::Values(AttentionKind::flash, AttentionKind::plain),
                         [](const auto& info) { return std::string(attention_kind_name(info.param)); });

}  // namespace
}  // namespace memfit
