// Activation checkpointing: every policy gives gradients bit-identical to keeping everything
// (FP32, and bf16 too, since recomputation reruns the same kernels on the same inputs), keeps
// fewer activation bytes where it should, and allocates nothing outside the plan.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "memfit/model/checkpoint_policy.h"
#include "memfit/model/transformer.h"

namespace memfit {
namespace {

ModelConfig four_layers(Family family) {
  ModelConfig c;  // odd sizes: T below the context, vocab not a multiple of 64
  c.family = family;
  if (family == Family::llama) c.n_kv_head = 1, c.ffn_dim = 48, c.tie_embeddings = false;
  c.n_layer = 4;
  c.n_head = 2;
  c.d_model = 32;
  c.max_seq_len = 24;
  c.vocab_size = 90;
  c.finalize();
  return c;
}

struct StepResult {
  float loss;
  std::vector<float> grads;
  size_t activations;
  bool allocated_in_step;
};

StepResult run(const std::string& ckpt, AttentionKind attention, Precision precision,
               Family family = Family::gpt2) {
  MemoryPool pool;
  ModelConfig c = four_layers(family);
  Transformer gpt(c, pool, {precision, true});
  gpt.init_weights(11);
  ActivationOptions o;
  o.attention = attention;
  o.ckpt = CheckpointPolicy::parse(ckpt);
  const int B = 2, T = 19;
  gpt.reserve(B, T, o);
  Tensor tokens = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "tokens");
  Tensor targets = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "targets");
  std::mt19937 rng(5);
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % c.vocab_size);
    targets.data<int32_t>()[i] = static_cast<int32_t>(rng() % c.vocab_size);
  }
  const size_t before = pool.bytes_current();
  StepResult r;
  r.loss = gpt.forward(tokens, targets, true);
  gpt.backward();
  r.allocated_in_step = pool.bytes_peak() != before;
  const float* g = gpt.grads().data<float>();
  r.grads.assign(g, g + gpt.grads().numel());
  r.activations = pool.bytes_current(Category::activations);
  return r;
}

struct Case {
  std::string ckpt;
  AttentionKind attention;
  Precision precision;
  Family family = Family::gpt2;
};

class Checkpointing : public ::testing::TestWithParam<Case> {};

TEST_P(Checkpointing, GradientsAreBitIdenticalToKeepingEverything) {
  const Case& k = GetParam();
  StepResult none = run("none", k.attention, k.precision, k.family);
  StepResult ck = run(k.ckpt, k.attention, k.precision, k.family);
  EXPECT_FALSE(ck.allocated_in_step) << "a step allocated outside the plan";
  EXPECT_EQ(none.loss, ck.loss);
  ASSERT_EQ(none.grads.size(), ck.grads.size());
  EXPECT_EQ(0, std::memcmp(none.grads.data(), ck.grads.data(), none.grads.size() * 4))
      << "gradients differ under --ckpt " << k.ckpt;
  // What each policy saves, against none: full keeps one block's worth plus each block's output;
  // every:2 two blocks' worth; layers:0,2 drops two blocks and adds one slot; selective drops
  // plain attention's probabilities but for one block.
  if (k.ckpt == "full" || k.ckpt == "every:2" || k.ckpt == "layers:0,2") {
    EXPECT_LT(ck.activations, none.activations);
  }
  if (k.ckpt == "selective") {
    if (k.attention == AttentionKind::plain)
      EXPECT_LT(ck.activations, none.activations);
    else
      EXPECT_EQ(ck.activations, none.activations);  // flash saves no probabilities already
  }
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Family f : {Family::gpt2, Family::llama})
    for (const char* ck : {"full", "selective", "every:2", "every:3", "layers:0,2", "layers:3"})
      for (AttentionKind a : {AttentionKind::flash, AttentionKind::plain})
        for (Precision p : {Precision::fp32, Precision::bf16}) out.push_back({ck, a, p, f});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Policies, Checkpointing, ::testing::ValuesIn(cases()),
                         [](const auto& info) {
                           std::string n = std::string(family_name(info.param.family)) + "_" +
                                           info.param.ckpt + "_" +
                                           std::string(attention_kind_name(info.param.attention)) +
                                           "_" + std::string(precision_name(info.param.precision));
                           for (char& ch : n)
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           return n;
                         });

TEST(CheckpointPolicy, ParsesNamesAndSegments) {
  EXPECT_EQ(CheckpointPolicy::parse("none").segments(4).size(), 0u);
  using Segs = std::vector<std::pair<int, int>>;
  EXPECT_EQ(CheckpointPolicy::parse("full").segments(3), (Segs{{0, 0}, {1, 1}, {2, 2}}));
  EXPECT_EQ(CheckpointPolicy::parse("every:2").segments(5), (Segs{{0, 1}, {2, 3}, {4, 4}}));
  EXPECT_EQ(CheckpointPolicy::parse("layers:3,1,3").segments(5), (Segs{{1, 1}, {3, 3}}));
  EXPECT_EQ(CheckpointPolicy::parse("layers:").segments(5), Segs{});
  for (const char* n : {"none", "full", "selective", "every:3", "layers:1,4"})
    EXPECT_EQ(CheckpointPolicy::parse(n).name(), n);
  // Ranges: runs of three or more print as ranges, and parse back to the same blocks.
  EXPECT_EQ(CheckpointPolicy::parse("layers:0-3,6").layers, (std::vector<int>{0, 1, 2, 3, 6}));
  EXPECT_EQ(CheckpointPolicy::parse("layers:5,0,1,2,3").name(), "layers:0-3,5");
  EXPECT_EQ(CheckpointPolicy::parse("layers:0,1,4,5,6,9").name(), "layers:0,1,4-6,9");
  EXPECT_EQ(CheckpointPolicy::parse("layers:2-2").name(), "layers:2");
  for (const char* bad : {"", "ful", "every:0", "every:", "every:x", "layers:1,,2", "layers:-1",
                          "layers:3-1", "layers:1-", "layers:-", "auto"})
    EXPECT_THROW(CheckpointPolicy::parse(bad), ConfigError) << bad;
  EXPECT_THROW(CheckpointPolicy::parse("layers:7").segments(4), ConfigError);
}

TEST(CheckpointPolicy, FullKeepsOneBlockAndEveryBlockOutput) {
  ModelConfig c = ModelConfig::preset("gpt2");
  const int B = 1, T = 1024;
  ActivationOptions none, full;
  full.ckpt = CheckpointPolicy::parse("full");
  auto bytes = [&](const ActivationOptions& o) {
    return plan_bytes(plan_step(c, B, T, o).buffers, Category::activations);
  };
  // A block's own bytes, its output (residual_3) among them.
  size_t block = 0, out = 0;
  for (const BufferSpec& b : plan_step(c, B, T, none).buffers) {
    if (b.tag.starts_with("h.0.")) block += b.bytes();
    if (b.tag == "h.0.residual_3") out = b.bytes();
  }
  // none keeps L blocks; full keeps L outputs and one slot of a block without its output.
  EXPECT_EQ(bytes(none) - bytes(full), (c.n_layer - 1) * (block - out));
  // qkv 3C, atty C, residual_2 C, fch 4C (the norm outputs are recomputed): 9C and the
  // statistics, against the output's C.
  EXPECT_GT(block - out, 9 * out);
  EXPECT_LT(block - out, 10 * out);
}

}  // namespace
}  // namespace memfit
