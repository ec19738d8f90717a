// Generation with a KV cache (model/kv_decoder.h, Note [KV cache]): the logits of every step,
// a prompt prefilled in several chunks and then one token at a time up to the context, against
// the full-context forward (Transformer::logits over the window) within a stated tolerance, for
// both families (GPT-2's learned positions and tied head; LLaMA's rotation with grouped-query
// heads and an untied head) in fp32, and in bf16 within bf16's; greedy decoding with the cache
// gives the cache-less tokens; the plan's bytes are the pool's measured peak; a full cache is an
// error naming the context.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "gpt2_test_util.h"
#include "memfit/model/kv_decoder.h"
#include "memfit/model/transformer.h"

namespace memfit {
namespace {

using namespace gpt2_test;

// Logits of every position of `ids` (one window, ids.size() <= context) from the training
// step's evaluation forward: the reference.
std::vector<float> full_logits(Transformer& gpt, MemoryPool& pool, const std::vector<int32_t>& ids) {
  const ModelConfig& c = gpt.config();
  const int T = static_cast<int>(ids.size()), V = c.vocab_size;
  ActivationOptions o;
  o.inference = true;
  if (gpt.precision().precision == Precision::fp16) o.attention = AttentionKind::plain;
  gpt.reserve(1, T, o);
  Tensor window = Tensor::empty(pool, {1, T}, DType::i32, Category::staging, "window");
  std::copy(ids.begin(), ids.end(), window.data<int32_t>());
  Tensor out = Tensor::empty(pool, {1, T, V}, DType::f32, Category::staging, "logits");
  gpt.logits(window, out);
  return {out.data<float>(), out.data<float>() + out.numel()};
}

ModelConfig config(Family family) {
  ModelConfig c = three_layers(family);  // odd sizes; LLaMA: 4 query heads over 2
  c.max_seq_len = 24;
  c.finalize();
  return c;
}

std::vector<int32_t> random_ids(int n, int vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (auto& t : ids) t = static_cast<int32_t>(rng() % vocab);
  return ids;
}

// Tolerance, on |difference| / (1 + the step's largest |logit|): fp32 1e-6 (the attention sums
// its keys in another order than flash does; measured at most 6.5e-8 on these models, AMD Zen
// 5); bf16 4e-3 (the attention output is rounded to bf16 from other f32 sums than flash's, and
// one bf16 rounding is 2^-9 relative; measured at most 5.7e-4).
void check_steps(Family family, Precision precision, double rel) {
  SCOPED_TRACE(fmt::format("{} {}", family_name(family), precision_name(precision)));
  const ModelConfig c = config(family);
  MemoryPool pool;
  Transformer gpt(c, pool, {precision, true});
  gpt.init_weights(11);
  const std::vector<int32_t> ids = random_ids(c.max_seq_len, c.vocab_size, 4);
  const std::vector<float> want = full_logits(gpt, pool, ids);
  const ModelWeights w = gpt.layout().views(gpt.params());
  KvDecoder dec(c, precision, w, pool, plan_kv_decode(c, precision, /*rows=*/3));
  const int prompt = 7;  // three steps of at most 3 rows
  const int V = c.vocab_size;
  double worst = 0;
  for (int p = prompt - 1; p < c.max_seq_len; ++p) {
    std::span<const float> got =
        p == prompt - 1 ? dec.append({ids.data(), static_cast<size_t>(prompt)})
                        : dec.append({ids.data() + p, 1});
    ASSERT_EQ(dec.position(), p + 1);
    const float* row = want.data() + static_cast<size_t>(p) * V;
    float scale = 0;
    for (int v = 0; v < V; ++v) scale = std::max(scale, std::abs(row[v]));
    for (int v = 0; v < V; ++v) {
      const double d = std::abs(got[v] - row[v]);
      worst = std::max(worst, d / (1 + scale));
      ASSERT_LE(d, rel * (1 + scale)) << "position " << p << " logit " << v;
    }
  }
  std::printf("%s %s: worst |difference| / (1 + max |logit|) %.3g\n",
              std::string(family_name(family)).c_str(),
              std::string(precision_name(precision)).c_str(), worst);
}

TEST(KvDecoder, EveryStepsLogitsAreTheFullContextForwardsInFp32) {
  for (Family f : {Family::gpt2, Family::llama}) check_steps(f, Precision::fp32, 1e-6);
}

TEST(KvDecoder, EveryStepsLogitsAreTheFullContextForwardsWithinBf16Rounding) {
  for (Family f : {Family::gpt2, Family::llama}) check_steps(f, Precision::bf16, 4e-3);
}

TEST(KvDecoder, GreedyTokensAreTheCachelessOnesUpToTheContext) {
  for (Family family : {Family::gpt2, Family::llama}) {
    SCOPED_TRACE(family_name(family));
    const ModelConfig c = config(family);
    MemoryPool pool;
    Transformer gpt(c, pool);
    gpt.init_weights(3);
    const std::vector<int32_t> prompt = random_ids(5, c.vocab_size, 9);
    auto argmax = [&](const float* row) {
      return static_cast<int32_t>(std::max_element(row, row + c.vocab_size) - row);
    };
    // Cache-less: the whole context again for every token (what --no-kv-cache does).
    std::vector<int32_t> want = prompt;
    while (static_cast<int>(want.size()) < c.max_seq_len + 1) {
      const std::vector<float> l = full_logits(gpt, pool, want);
      want.push_back(argmax(l.data() + (want.size() - 1) * c.vocab_size));
    }
    const ModelWeights w = gpt.layout().views(gpt.params());
    KvDecoder dec(c, Precision::fp32, w, pool, plan_kv_decode(c, Precision::fp32));
    std::vector<int32_t> got = prompt;
    std::span<const float> l = dec.append(prompt);
    while (true) {
      got.push_back(argmax(l.data()));
      if (dec.position() == dec.context()) break;  // the token past the context is the last
      l = dec.append({&got.back(), 1});
    }
    EXPECT_EQ(got, want);
    EXPECT_EQ(static_cast<int>(got.size()), c.max_seq_len + 1);
  }
}

TEST(KvDecoder, ThePlansBytesAreTheMeasuredPeak) {
  for (Family family : {Family::gpt2, Family::llama}) {
    for (Precision precision : {Precision::fp32, Precision::bf16, Precision::fp16}) {
      SCOPED_TRACE(fmt::format("{} {}", family_name(family), precision_name(precision)));
      const ModelConfig c = config(family);
      MemoryPool pool;
      Transformer gpt(c, pool, {precision, true});
      gpt.init_weights(1);
      const size_t weights = pool.bytes_current();
      pool.reset_peak();
      const KvPlan plan = plan_kv_decode(c, precision, 4);
      const ModelWeights w = gpt.layout().views(gpt.params());
      {
        KvDecoder dec(c, precision, w, pool, plan);
        const std::vector<int32_t> ids = random_ids(c.max_seq_len, c.vocab_size, 2);
        dec.append({ids.data(), 10});
        for (int p = 10; p < c.max_seq_len; ++p) dec.append({ids.data() + p, 1});
        EXPECT_EQ(pool.bytes_current(Category::activations), plan.cache_bytes);
        EXPECT_EQ(pool.bytes_current(Category::workspace), plan.scratch_bytes);
      }
      EXPECT_EQ(pool.bytes_peak() - weights, plan.total());
      EXPECT_EQ(pool.bytes_current(), weights);
      // The cache: layers x keys and values x positions x key/value width x the type's size.
      EXPECT_EQ(plan.cache_bytes,
                MemoryPool::round_up(size_t{3} * 2 * 24 * c.n_kv_head * c.head_size() *
                                     dtype_size(half_dtype(precision))));
    }
  }
}

TEST(KvDecoder, AFullCacheIsAnErrorNamingTheContext) {
  const ModelConfig c = config(Family::llama);
  MemoryPool pool;
  Transformer gpt(c, pool);
  gpt.init_weights(1);
  const ModelWeights w = gpt.layout().views(gpt.params());
  KvDecoder dec(c, Precision::fp32, w, pool, plan_kv_decode(c, Precision::fp32));
  const std::vector<int32_t> ids = random_ids(c.max_seq_len + 1, c.vocab_size, 5);
  dec.append({ids.data(), static_cast<size_t>(c.max_seq_len)});
  try {
    dec.append({ids.data() + c.max_seq_len, 1});
    FAIL() << "appended past the context";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("past the context of 24"), std::string::npos) << e.what();
  }
  dec.reset();
  EXPECT_EQ(dec.position(), 0);
  EXPECT_EQ(dec.append({ids.data(), 1}).size(), static_cast<size_t>(c.vocab_size));
}

}  // namespace
}  // namespace memfit
