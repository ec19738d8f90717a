// The whole LLaMA's gradient by finite differences: a double-precision LLaMA built from the
// reference kernels (RMSNorm, rotary embedding, grouped-query attention, SwiGLU, the head untied
// or tied) gives the loss; central differences of it, at sampled entries of every parameter
// tensor, must match the gradient memfit's FP32 backward computes, with flash and plain
// attention. As gpt2_gradient_test.cpp for GPT-2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "memfit/kernels/ref/attention_ref.h"
#include "memfit/kernels/ref/crossentropy_ref.h"
#include "memfit/kernels/ref/matmul_ref.h"
#include "memfit/kernels/ref/residual_ref.h"
#include "memfit/kernels/ref/rmsnorm_ref.h"
#include "memfit/kernels/ref/rope_ref.h"
#include "memfit/kernels/ref/swiglu_ref.h"
#include "memfit/model/transformer.h"
#include "gradient_test_util.h"

namespace memfit {
namespace {

using namespace kernels::ref;

// Writes rows (N, a) and (N, b) side by side into (N, a + b).
void concat_rows(double* out, const double* x, int64_t a, const double* y, int64_t b, int64_t N) {
  for (int64_t r = 0; r < N; ++r) {
    std::copy_n(x + r * a, a, out + r * (a + b));
    std::copy_n(y + r * b, b, out + r * (a + b) + a);
  }
}

// Mean cross-entropy of LLaMA in double precision, parameters found by their Hugging Face names
// in `layout` (each projection on its own, not through memfit's fused q|k|v and gate|up views).
double reference_loss(const ModelConfig& c, const ParamLayout& layout, const std::vector<double>& w,
                      const std::vector<int32_t>& tokens, const std::vector<int32_t>& targets,
                      int B, int T) {
  const int64_t N = int64_t{B} * T, C = c.d_model, Vp = c.padded_vocab, F = c.ffn_dim;
  const int64_t hs = c.head_size(), Q = int64_t{c.n_head} * hs, KV = int64_t{c.n_kv_head} * hs;
  const int64_t W = Q + 2 * KV;
  auto p = [&](const std::string& name) { return w.data() + layout.find(name).offset; };
  auto h = [&](int l, const char* what) { return p(fmt::format("model.layers.{}.{}", l, what)); };
  std::vector<double> x(N * C), n(N * C), rstd(N), q(N * Q), k(N * KV), v(N * KV), kv(N * 2 * KV),
      qkv(N * W), att(int64_t{B} * c.n_head * T * T), y(N * Q), proj(N * C), gate(N * F), up(N * F),
      gate_up(N * 2 * F), act(N * F), logits(N * Vp), losses(N);
  std::vector<double> inv_freq(hs / 2), table(T * hs);
  const auto& rs = c.rope_scaling;
  rope_inv_freq_ref(inv_freq.data(), hs, c.rope_theta, rs.factor, rs.low_freq_factor,
                    rs.high_freq_factor, rs.original_max_position);
  rope_table_ref(table.data(), inv_freq.data(), T, hs);
  const double* wte = p("model.embed_tokens.weight");
  for (int64_t i = 0; i < N; ++i) std::copy_n(wte + int64_t{tokens[i]} * C, C, x.data() + i * C);
  for (int l = 0; l < c.n_layer; ++l) {
    rmsnorm_forward_ref(n.data(), rstd.data(), x.data(), h(l, "input_layernorm.weight"), N, C,
                        c.norm_eps);
    matmul_forward(q.data(), n.data(), h(l, "self_attn.q_proj.weight"), nullptr, N, C, Q);
    matmul_forward(k.data(), n.data(), h(l, "self_attn.k_proj.weight"), nullptr, N, C, KV);
    matmul_forward(v.data(), n.data(), h(l, "self_attn.v_proj.weight"), nullptr, N, C, KV);
    concat_rows(kv.data(), k.data(), KV, v.data(), KV, N);
    concat_rows(qkv.data(), q.data(), Q, kv.data(), 2 * KV, N);
    rope_forward_ref(qkv.data(), table.data(), B, T, c.n_head, c.n_kv_head, hs);
    attention_forward(y.data(), att.data(), qkv.data(), B, T, Q,
                      kernels::AttentionHeads(c.n_head, c.n_kv_head));
    matmul_forward(proj.data(), y.data(), h(l, "self_attn.o_proj.weight"), nullptr, N, Q, C);
    residual_forward_ref(x.data(), x.data(), proj.data(), N * C);
    rmsnorm_forward_ref(n.data(), rstd.data(), x.data(), h(l, "post_attention_layernorm.weight"),
                        N, C, c.norm_eps);
    matmul_forward(gate.data(), n.data(), h(l, "mlp.gate_proj.weight"), nullptr, N, C, F);
    matmul_forward(up.data(), n.data(), h(l, "mlp.up_proj.weight"), nullptr, N, C, F);
    concat_rows(gate_up.data(), gate.data(), F, up.data(), F, N);
    swiglu_forward_ref(act.data(), gate_up.data(), N, F);
    matmul_forward(proj.data(), act.data(), h(l, "mlp.down_proj.weight"), nullptr, N, F, C);
    residual_forward_ref(x.data(), x.data(), proj.data(), N * C);
  }
  rmsnorm_forward_ref(n.data(), rstd.data(), x.data(), p("model.norm.weight"), N, C, c.norm_eps);
  const double* head = c.tie_embeddings ? wte : p("lm_head.weight");
  matmul_forward(logits.data(), n.data(), head, nullptr, N, C, Vp);
  crossentropy_forward_ref(losses.data(), logits.data(), targets.data(), N, Vp, c.vocab_size);
  double sum = 0;
  for (double l : losses) sum += l;
  return sum / N;
}

// (attention, tied head)
class LlamaGradient : public ::testing::TestWithParam<std::tuple<AttentionKind, bool>> {};

TEST_P(LlamaGradient, MatchesFiniteDifferencesOfADoublePrecisionReference) {
  const auto [attention, tied] = GetParam();
  ModelConfig c = ModelConfig::preset("llama-tiny");  // 4 query heads over 2 key/value heads
  ASSERT_LT(c.n_kv_head, c.n_head);
  c.vocab_size = 300;  // not a multiple of 64: padded rows must stay out of it
  c.tie_embeddings = tied;  // tied: the embedding's gradient sums the head's and the lookup's
  c.finalize();
  const int B = 2, T = 7;
  MemoryPool pool;
  Transformer llama(c, pool);
  llama.init_weights(99);
  std::mt19937 rng(5);
  gradient_test::add_noise(c, llama.layout(), llama.params(), rng);  // norm gains differ from 1
  ActivationOptions options;
  options.attention = attention;
  llama.reserve(B, T, options);
  gradient_test::RandomBatch batch(pool, B, T, c.vocab_size, rng);
  const std::vector<int32_t>& tok = batch.tok;
  const std::vector<int32_t>& tgt = batch.tgt;
  float loss = llama.forward(batch.tokens, batch.targets, true);
  llama.backward();

  std::vector<double> w(llama.params().data<float>(),
                        llama.params().data<float>() + llama.params().numel());
  const double ref_loss = reference_loss(c, llama.layout(), w, tok, tgt, B, T);
  EXPECT_NEAR(loss, ref_loss, 1e-5);

  double worst = 0;
  for (const ParamInfo& p : llama.layout().params()) {
    const auto [diff, norm] = gradient_test::finite_difference_error(
        p, gradient_test::real_numel(c, p), c.d_model, tok, w, llama.grads().data<float>(), rng,
        [&] { return reference_loss(c, llama.layout(), w, tok, tgt, B, T); });
    worst = std::max(worst, diff / (norm + 1e-12));
    EXPECT_LT(diff, 1e-4 * norm + 1e-8) << p.name;
    EXPECT_GT(norm, 0.0) << p.name << ": no sampled entry has a gradient";
  }
  std::printf("loss %.8f (reference %.8f); worst relative gradient error against finite "
              "differences: %.2e\n", loss, ref_loss, worst);
}

INSTANTIATE_TEST_SUITE_P(
    AttentionAndHead, LlamaGradient,
    ::testing::Combine(::testing::Values(AttentionKind::flash, AttentionKind::plain),
                       ::testing::Bool()),
    [](const auto& info) {
      return fmt::format("{}_{}", attention_kind_name(std::get<0>(info.param)),
                         std::get<1>(info.param) ? "tied" : "untied");
    });

}  // namespace
}  // namespace memfit
