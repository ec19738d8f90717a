// LoRA (model/lora.h, Note [LoRA]) against PyTorch: the fixture (tests/reference/
// make_lora_fixture.py) puts adapters of rank 4, alpha 8 on every linear layer of the GPT-2 and
// LLaMA reference models (LLaMA's q, k, v and gate, up as row ranges of memfit's fused layers)
// with a random B, and holds the logits, the loss and the adapters' gradients. In fp32 each is
// within 1e-5 (relative for tensors, absolute for the loss), with the base frozen (no gradient
// slab). Also: with PEFT's initialisation (B = 0) the first forward is the base model's, bit for
// bit; an AdamW step over the adapters' layout changes them and leaves the base weights' bits;
// and the options' refusals.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <string>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/model/lora.h"
#include "memfit/model/lora_dropout.h"
#include "memfit/model/transformer.h"
#include "memfit/optim/adamw.h"
#include "reference_test_util.h"

namespace memfit {
namespace {

const char* kFixture = MEMFIT_SOURCE_DIR "/tests/reference/lora_fixture.safetensors";

using reference_test::rel_error;

class LoraReference : public ::testing::TestWithParam<Family> {
 protected:
  LoraReference() : file{kFixture} {}
  void SetUp() override {
    fam = GetParam() == Family::gpt2 ? "gpt2." : "llama.";
    config.family = GetParam();
    config.n_layer = int(meta("n_layer"));
    config.n_head = int(meta("n_head"));
    config.d_model = int(meta("d_model"));
    config.max_seq_len = int(meta("max_seq_len"));
    config.vocab_size = int(meta("vocab_size"));
    if (GetParam() == Family::llama) {
      config.n_kv_head = int(meta("n_kv_head"));
      config.ffn_dim = int(meta("ffn_dim"));
      config.rope_theta = meta("rope_theta");
      config.norm_eps = float(meta("norm_eps"));
      config.tie_embeddings = false;
    }
    config.finalize();
    B = int(meta("B"));
    T = int(meta("T"));
    lora.rank = std::stoi(file.metadata().at("rank"));
    lora.alpha = std::stof(file.metadata().at("alpha"));
    lora.targets = "all-linear";
  }
  double meta(const std::string& key) const {
    return std::stod(file.metadata().at(fam + key));
  }
  Tensor load(const std::string& name, Shape shape, DType dtype = DType::f32) {
    Tensor t = Tensor::empty(pool, shape, dtype, Category::staging, name);
    file.read(fam + name, t);
    return t;
  }
  void load_base(Transformer& m) {
    for (const ParamInfo& p : m.layout().params())
      file.read(fam + "param." + p.name, m.param(p.name));
  }

  io::SafetensorsReader file;
  std::string fam;
  MemoryPool pool;
  ModelConfig config;
  LoraOptions lora;
  int B = 0, T = 0;
};

TEST_P(LoraReference, LogitsLossAndAdapterGradientsMatchPyTorch) {
  Transformer m(config, pool);
  load_base(m);
  m.add_lora(lora, 1);
  EXPECT_FALSE(m.grads().defined());  // frozen: no base gradient slab
  const ParamLayout& adapters = m.lora()->param_layout();
  for (const ParamInfo& p : adapters.params())
    file.read(fam + p.name, m.lora_weights().view(p.offset, p.shape));
  m.reserve(B, T);
  EXPECT_FALSE(m.grads().defined());
  Tensor tokens = load("tokens", {B, T}, DType::i32), targets = load("targets", {B, T}, DType::i32);
  const Shape ls{B, T, config.vocab_size};
  Tensor logits = Tensor::empty(pool, ls, DType::f32, Category::staging, "l");
  m.logits(tokens, logits);
  EXPECT_LT(rel_error(logits, load("logits", {B, T, config.vocab_size})), 1e-5);
  m.zero_grad();
  const float loss = m.forward(tokens, targets, true);
  m.backward();
  EXPECT_NEAR(loss, load("loss", {1}).data<float>()[0], 1e-5);
  double worst = 0;
  for (const ParamInfo& p : adapters.params()) {
    const double e =
        rel_error(m.lora_grads().view(p.offset, p.shape), load("grad." + p.name, p.shape));
    worst = std::max(worst, e);
    EXPECT_LT(e, 1e-5) << "gradient of " << p.name;
  }
  std::printf("%s: worst adapter gradient error %.2e\n", fam.c_str(), worst);
}

TEST_P(LoraReference, PeftInitIsTheBaseModelAndAStepChangesOnlyTheAdapters) {
  Transformer base(config, pool);
  load_base(base);
  base.reserve(B, T);
  Tensor tokens = load("tokens", {B, T}, DType::i32), targets = load("targets", {B, T}, DType::i32);
  const Shape ls{B, T, config.vocab_size};
  Tensor want = Tensor::empty(pool, ls, DType::f32, Category::staging, "want");
  base.logits(tokens, want);

  Transformer m(config, pool);
  load_base(m);
  m.add_lora(lora, 7);
  m.reserve(B, T);
  Tensor got = Tensor::empty(pool, ls, DType::f32, Category::staging, "got");
  m.logits(tokens, got);
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()), 0);

  Tensor before = Tensor::empty(pool, {m.layout().total()}, DType::f32, Category::staging, "b");
  std::memcpy(before.raw_data(), m.params().raw_data(), before.nbytes());
  Tensor adapters = Tensor::empty(pool, {m.lora()->total()}, DType::f32, Category::staging, "a");
  std::memcpy(adapters.raw_data(), m.lora_weights().raw_data(), adapters.nbytes());
  OptimConfig oc;
  AdamW opt(oc, m.lora()->param_layout(), pool);
  for (int s = 0; s < 2; ++s) {
    m.zero_grad();
    m.forward(tokens, targets, true);
    m.backward();
    opt.step(m.lora_weights(), m.lora_grads(), 1e-2f, 1.0f);
  }
  EXPECT_EQ(std::memcmp(m.params().raw_data(), before.raw_data(), before.nbytes()), 0);
  // Both A and B of every adapter moved (B from zero after the first step, A after the second).
  const ParamLayout& layout = m.lora()->param_layout();
  for (const ParamInfo& p : layout.params())
    EXPECT_GT(rel_error(m.lora_weights().view(p.offset, p.shape), adapters.view(p.offset, p.shape)),
              1e-4)
        << p.name;
  m.logits(tokens, got);
  EXPECT_NE(std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()), 0);
}

INSTANTIATE_TEST_SUITE_P(Families, LoraReference, ::testing::Values(Family::gpt2, Family::llama),
                         [](const auto& info) { return std::string(family_name(info.param)); });

TEST(LoraOptions, RefusesWhatIsNotBuilt) {
  auto refused = [](LoraOptions o, Family f, const char* needle) {
    try {
      check_lora_options(o, f);
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      return;
    }
    ADD_FAILURE() << "accepted " << o.targets;
  };
  LoraOptions o;
  o.rank = 8;
  EXPECT_NO_THROW(check_lora_options(o, Family::gpt2));
  o.targets = "q,v,down";
  EXPECT_NO_THROW(check_lora_options(o, Family::llama));
  refused(o, Family::gpt2, "attn,proj,fc,mlp_proj");  // LLaMA's names on GPT-2
  o.targets = "attn,attn";
  refused(o, Family::gpt2, "twice");
  o.targets = "";
  refused(o, Family::llama, "q,k,v,o,gate,up,down");
  o.targets = "all-linear";
  o.dropout = 0.1f;  // built (lora_dropout_test.cpp)
  EXPECT_NO_THROW(check_lora_options(o, Family::llama));
  for (const float p : {1.0f, -0.1f, std::nanf("")}) {
    o.dropout = p;
    refused(o, Family::llama, "--lora-dropout");
  }
  o.dropout = 0;
  o.rank = 0;
  refused(o, Family::llama, "--lora-rank");
}

// What add_lora does not build is refused before anything is allocated: bf16 (the adapters'
// GEMMs are f32), and adding them twice or after reserve().
TEST(LoraOptions, AddLoraRefusesWhatIsNotBuilt) {
  ModelConfig c;
  c.family = Family::gpt2;
  c.n_layer = 1;
  c.n_head = 2;
  c.d_model = 16;
  c.max_seq_len = 8;
  c.vocab_size = 64;
  c.finalize();
  MemoryPool pool;
  LoraOptions o;
  o.rank = 2;
  PrecisionOptions bf16;
  bf16.precision = Precision::bf16;
  Transformer half(c, pool, bf16);
  const size_t before = pool.bytes_current();
  try {
    half.add_lora(o, 1);
    ADD_FAILURE() << "LoRA on a bf16 model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp32"), std::string::npos) << e.what();
  }
  EXPECT_EQ(pool.bytes_current(), before);
  Transformer m(c, pool);
  m.add_lora(o, 1);
  EXPECT_THROW(m.add_lora(o, 1), Error);
  Transformer late(c, pool);
  late.reserve(1, 8);
  EXPECT_THROW(late.add_lora(o, 1), Error);
}

TEST(LoraLayout, PeftNamesAndFusedRowRanges) {
  ModelConfig c;
  c.family = Family::llama;
  c.n_layer = 1;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_model = 32;
  c.ffn_dim = 48;
  c.max_seq_len = 8;
  c.vocab_size = 64;
  c.finalize();
  LoraOptions o;
  o.rank = 2;
  o.targets = "v,up";
  const LoraLayout l(c, o);
  ASSERT_EQ(l.params().size(), 2u);
  EXPECT_EQ(l.params()[0].module, "model.layers.0.self_attn.v_proj");
  EXPECT_EQ(l.params()[0].row0, 32 + 16);  // after q (4 heads of 8) and k (2 heads)
  EXPECT_EQ(l.params()[0].out, 16);
  EXPECT_EQ(l.params()[1].module, "model.layers.0.mlp.up_proj");
  EXPECT_EQ(l.params()[1].row0, 48);
  EXPECT_EQ(l.param_layout().params()[1].name, "model.layers.0.self_attn.v_proj.lora_B.weight");
}

}  // namespace
}  // namespace memfit

namespace memfit {
namespace {

// What a LoRA model holds, at two shapes of each family: the base weights (no gradient slab),
// the adapters' weights and gradients, an optimizer's state over the adapters alone, and the
// step plan's arenas (with the adapters' (rows, rank) scratch, and with dropout the dropped
// input's chunk); a training step and an update allocate nothing more, so the peak is that sum
// exactly.
TEST(LoraMemory, PoolHoldsBaseWeightsAdaptersTheirStateAndThePlanExactly) {
  for (const Family f : {Family::gpt2, Family::llama})
    for (const auto& [B, T, p] : {std::tuple{2, 16, 0.0f}, std::tuple{3, 24, 0.0f},
                                 std::tuple{3, 24, 0.25f}}) {
      ModelConfig c;
      c.family = f;
      c.n_layer = 2;
      c.n_head = 4;
      c.d_model = 32;
      c.max_seq_len = 32;
      c.vocab_size = 100;
      if (f == Family::llama) {
        c.n_kv_head = 2;
        c.ffn_dim = 48;
      }
      c.finalize();
      MemoryPool pool;
      LoraOptions o;
      o.rank = 4;
      o.dropout = p;
      Transformer m(c, pool);
      m.init_weights(1);
      m.add_lora(o, 1);
      ActivationOptions options;
      m.reserve(B, T, options);
      AdamW opt(OptimConfig{}, m.lora()->param_layout(), pool);
      options.lora_rank = o.rank;
      options.lora_dropout = p;
      const StepPlan plan = plan_step(c, B, T, options);
      const size_t adapters = MemoryPool::round_up(m.lora()->total() * sizeof(float));
      const std::string at = fmt::format("{} {} x {} dropout {}", family_name(f), B, T, p);
      EXPECT_EQ(pool.bytes_current(Category::params),
                MemoryPool::round_up(c.num_params() * sizeof(float)) + adapters)
          << at;
      EXPECT_EQ(pool.bytes_current(Category::grads), adapters) << at;
      EXPECT_EQ(pool.bytes_current(Category::optimizer), opt.state_bytes()) << at;
      EXPECT_EQ(opt.state_bytes(), 2 * adapters) << at;  // AdamW's two moments
      for (Category cat : {Category::activations, Category::workspace})
        EXPECT_EQ(pool.bytes_current(cat), plan.arena[static_cast<size_t>(cat)]) << at;
      bool scratch = false, dropped = false;
      for (const BufferSpec& b : plan.buffers) {
        if (b.tag == "ws.lora.u") scratch = b.shape == Shape{int64_t{B} * T, o.rank};
        if (b.tag == "ws.lora.xd") dropped = b.shape == Shape{int64_t{B} * T, c.ffn_dim};
      }
      EXPECT_TRUE(scratch) << at;
      EXPECT_EQ(dropped, p > 0) << at;
      Tensor tokens = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "t");
      for (int64_t i = 0; i < tokens.numel(); ++i) tokens.data<int32_t>()[i] = int32_t(i % 100);
      const size_t before = pool.bytes_current();
      m.zero_grad();
      m.set_lora_dropout_draw(lora_dropout_draw(1, 0, 0));
      m.forward(tokens, tokens, true);
      m.backward();
      opt.step(m.lora_weights(), m.lora_grads(), 1e-3f, 1.0f);
      EXPECT_EQ(pool.bytes_peak(), before) << at << ": a LoRA step allocated outside the plan";
    }
}

}  // namespace
}  // namespace memfit
