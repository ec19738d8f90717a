// LoRA under --precision bf16 (Note [LoRA], "bf16"): the frozen base is its bf16 working
// weights alone (no master weights, no gradients), the adapters f32 with their f32 gradients,
// and the adapters' GEMMs read the bf16 activations widened a chunk of kLoraChunkRows rows at a
// time. Checked against the fp32 LoRA model on the same (bf16-representable) base weights and
// adapters: the loss within 1e-3 (relative) and every adapter gradient within 2e-2 (relative
// L2; bf16 rounds every matmul input, 2^-9 relative, through two blocks; measured 6.2e-3 GPT-2,
// 6.8e-3 LLaMA, loss 1e-6 relative); a step changes the
// adapters alone; and the pool holds exactly the base's bf16 bytes, the adapters, their state
// and the plan's arenas (with the widening scratch), at a shape that takes two chunks.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>

#include <fmt/format.h>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/model/block_step.h"
#include "memfit/model/lora.h"
#include "memfit/model/transformer.h"
#include "memfit/optim/adamw.h"
#include "reference_test_util.h"

namespace memfit {
namespace {

using reference_test::rel_error;

ModelConfig tiny(Family f) {
  ModelConfig c;
  c.family = f;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 32;
  c.max_seq_len = 160;
  c.vocab_size = 100;
  if (f == Family::llama) {
    c.n_kv_head = 2;
    c.ffn_dim = 48;
  }
  c.finalize();
  return c;
}

PrecisionOptions bf16_base() {
  PrecisionOptions p;
  p.precision = Precision::bf16;
  p.master_weights = false;
  return p;
}

Tensor tokens_of(MemoryPool& pool, int B, int T, int shift) {
  Tensor t = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "tokens");
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<int32_t>()[i] = int32_t((i * 37 + shift) % 100);
  return t;
}

// Two rows of blocks (B x T = 2 x 160 = 320 rows: a chunk of 256 and one of 64).
class LoraBf16 : public ::testing::TestWithParam<Family> {};

TEST_P(LoraBf16, StepIsTheFp32StepWithinToleranceAndChangesOnlyTheAdapters) {
  const ModelConfig c = tiny(GetParam());
  const int B = 2, T = 160;
  MemoryPool pool;
  LoraOptions o;
  o.rank = 4;
  o.alpha = 8;
  Transformer m32(c, pool), m16(c, pool, bf16_base());
  EXPECT_FALSE(m16.has_master());
  // One base for both: drawn in f32, rounded to bf16 (exact in f32 again).
  m32.init_weights(3);
  kernels::convert(m16.params(), m32.params());
  kernels::convert(m32.params(), m16.params());
  m32.add_lora(o, 5);
  m16.add_lora(o, 5);
  EXPECT_FALSE(m16.grads().defined());
  // B random (PEFT's zero would leave A's gradient zero), the same in both.
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (const LoraParam& p : m32.lora()->params())
    for (int64_t i = 0; i < p.out * o.rank; ++i)
      m32.lora_weights().data<float>()[p.b_offset + i] = normal(gen);
  std::memcpy(m16.lora_weights().raw_data(), m32.lora_weights().raw_data(),
              m32.lora_weights().nbytes());
  m32.reserve(B, T);
  m16.reserve(B, T);
  Tensor tokens = tokens_of(pool, B, T, 0), targets = tokens_of(pool, B, T, 1);

  m32.zero_grad();
  const float loss32 = m32.forward(tokens, targets, true);
  m32.backward();
  m16.zero_grad();
  const float loss16 = m16.forward(tokens, targets, true);
  m16.backward();
  EXPECT_NEAR(loss16, loss32, 1e-3 * loss32);
  double worst = 0;
  for (const ParamInfo& p : m32.lora()->param_layout().params()) {
    const double e = rel_error(m16.lora_grads().view(p.offset, p.shape),
                               m32.lora_grads().view(p.offset, p.shape));
    worst = std::max(worst, e);
    EXPECT_LT(e, 2e-2) << p.name;
  }
  fmt::print("{}: loss {:.6f} (fp32 {:.6f}), worst adapter gradient error {:.2e}\n",
             family_name(GetParam()), loss16, loss32, worst);

  Tensor base = Tensor::empty(pool, {m16.layout().total()}, DType::bf16, Category::staging, "b");
  std::memcpy(base.raw_data(), m16.params().raw_data(), base.nbytes());
  Tensor adapters =
      Tensor::empty(pool, {m16.lora()->total()}, DType::f32, Category::staging, "a");
  std::memcpy(adapters.raw_data(), m16.lora_weights().raw_data(), adapters.nbytes());
  AdamW opt(OptimConfig{}, m16.lora()->param_layout(), pool);
  opt.step(m16.lora_weights(), m16.lora_grads(), 1e-2f, 1.0f);
  EXPECT_EQ(std::memcmp(m16.params().raw_data(), base.raw_data(), base.nbytes()), 0);
  for (const ParamInfo& p : m16.lora()->param_layout().params())
    EXPECT_GT(rel_error(m16.lora_weights().view(p.offset, p.shape),
                        adapters.view(p.offset, p.shape)),
              1e-4)
        << p.name;
}

// What a bf16 LoRA model holds: the base's bf16 bytes (no master, no gradients), the adapters'
// f32 weights and gradients, AdamW's state over them, and the plan's arenas, which declare the
// widening scratch; a step and an update allocate nothing more.
TEST_P(LoraBf16, PoolHoldsTheBf16BaseAdaptersTheirStateAndThePlanExactly) {
  const ModelConfig c = tiny(GetParam());
  for (const auto& [B, T] : {std::pair{2, 16}, std::pair{2, 160}}) {
    MemoryPool pool;
    LoraOptions o;
    o.rank = 4;
    Transformer m(c, pool, bf16_base());
    m.init_weights(1);
    m.add_lora(o, 1);
    ActivationOptions options;
    m.reserve(B, T, options);
    AdamW opt(OptimConfig{}, m.lora()->param_layout(), pool);
    options.precision = Precision::bf16;
    options.lora_rank = o.rank;
    const StepPlan plan = plan_step(c, B, T, options);
    const size_t adapters = MemoryPool::round_up(m.lora()->total() * sizeof(float));
    const std::string at = fmt::format("{} x {}", B, T);
    EXPECT_EQ(pool.bytes_current(Category::params),
              MemoryPool::round_up(c.num_params() * 2) + adapters)
        << at;
    EXPECT_EQ(pool.bytes_current(Category::master), 0u) << at;
    EXPECT_EQ(pool.bytes_current(Category::grads), adapters) << at;
    EXPECT_EQ(pool.bytes_current(Category::optimizer), opt.state_bytes()) << at;
    for (Category cat : {Category::activations, Category::workspace})
      EXPECT_EQ(pool.bytes_current(cat), plan.arena[static_cast<size_t>(cat)]) << at;
    bool widen = false;
    for (const BufferSpec& b : plan.buffers)
      if (b.tag == "ws.lora.x")
        widen = b.shape[0] == std::min<int64_t>(int64_t{B} * T, kLoraChunkRows);
    EXPECT_TRUE(widen) << at;
    Tensor tokens = tokens_of(pool, B, T, 0);
    const size_t before = pool.bytes_current();
    m.zero_grad();
    const float loss = m.forward(tokens, tokens, true);
    m.backward();
    opt.step(m.lora_weights(), m.lora_grads(), 1e-3f, 1.0f);
    EXPECT_TRUE(std::isfinite(loss)) << at;
    EXPECT_EQ(pool.bytes_peak(), before) << at << ": a LoRA step allocated outside the plan";
  }
}

// A bf16 model with master weights (the base would have a copy nobody updates), and fp16, are
// refused before anything is allocated.
TEST(LoraBf16Refusals, MasterWeightsAndFp16AreRefused) {
  const ModelConfig c = tiny(Family::gpt2);
  MemoryPool pool;
  LoraOptions o;
  o.rank = 2;
  PrecisionOptions with_master;
  with_master.precision = Precision::bf16;
  PrecisionOptions f16;
  f16.precision = Precision::fp16;
  for (const PrecisionOptions& p : {with_master, f16}) {
    Transformer m(c, pool, p);
    const size_t before = pool.bytes_current();
    try {
      m.add_lora(o, 1);
      ADD_FAILURE() << "LoRA on " << precision_name(p.precision);
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("no master weights"), std::string::npos) << e.what();
    }
    EXPECT_EQ(pool.bytes_current(), before);
  }
}

INSTANTIATE_TEST_SUITE_P(Families, LoraBf16, ::testing::Values(Family::gpt2, Family::llama),
                         [](const auto& info) { return std::string(family_name(info.param)); });

}  // namespace
}  // namespace memfit
