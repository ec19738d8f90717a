// A quantized base: QLoRA (--base-dtype nf4; Note [NF4 weights], "QLoRA") and int8 (--base-dtype
// int8; Note [Int8 weights]): the frozen base's block linears are NF4 or int8 (quantized at
// load, multiplied through kernels/cpu/quant_matmul.h's tiles), everything else as the
// precision says. Every test runs for both formats, both families, fp32 and bf16. Checked
// against a LoRA model whose dense base is the quantized base dequantized
// (Transformer::read_base_range: the values the tiles multiply by), so the only
// difference is the GEMMs' blocking: fp32 loss within 1e-5 and adapter gradients within 1e-4
// (relative L2), bf16 loss within 1e-3 and gradients within 2e-2 (bf16 rounds every matmul
// output; the LoRA bf16 test's bound). Against the original (unquantized) bf16 base the loss
// moves by the format's rounding of the weights, within 5e-2 relative (printed). A step and an
// update leave the base (quantized bytes and the compact slab) unchanged; the pool holds
// exactly the compact slab, the quantized buffer, the adapters, their state and the plan's
// arenas (ws.quant, no ws.widen).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <tuple>

#include <fmt/format.h>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/quant_weight.h"
#include "memfit/model/block_step.h"
#include "memfit/model/lora.h"
#include "memfit/model/transformer.h"
#include "memfit/optim/adamw.h"
#include "reference_test_util.h"

namespace memfit {
namespace {

using reference_test::rel_error;
using kernels::WeightQuant;

ModelConfig tiny(Family f) {
  ModelConfig c;
  c.family = f;
  c.n_layer = 2;
  c.n_head = 4;
  c.d_model = 64;
  c.max_seq_len = 160;
  c.vocab_size = 100;
  if (f == Family::llama) {
    c.n_kv_head = 2;
    c.ffn_dim = 96;  // 96 columns: NF4 blocks of 64 span rows of down_proj
  }
  c.finalize();
  return c;
}

PrecisionOptions precision_of(Precision p) {
  PrecisionOptions o;
  o.precision = p;
  o.master_weights = p == Precision::fp32;  // LoRA's frozen bf16 base keeps none
  return o;
}

ModelState quant_state(WeightQuant q) {
  ModelState s;
  s.base_quant = q;
  return s;
}

LoraBase lora_base_of(WeightQuant q) {
  switch (q) {
    case WeightQuant::nf4: return LoraBase::nf4;
    case WeightQuant::int8: return LoraBase::int8;
  }
  return LoraBase::precision;
}

Tensor tokens_of(MemoryPool& pool, int B, int T, int shift) {
  Tensor t = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "tokens");
  for (int64_t i = 0; i < t.numel(); ++i)
    t.data<int32_t>()[i] = int32_t((i * 37 + shift) % 100);
  return t;
}

// B random (PEFT's zero would leave A's gradient zero), the same in every model.
void randomize_b(Transformer& m, int rank) {
  std::mt19937 gen(11);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (const LoraParam& p : m.lora()->params())
    for (int64_t i = 0; i < p.out * rank; ++i)
      m.lora_weights().data<float>()[p.b_offset + i] = normal(gen);
}

// The dense model's working slab = the quantized model's base, dequantized where it is
// quantized.
void copy_dequantized_base(const Transformer& quant, Transformer& dense, MemoryPool& pool) {
  Tensor staging = Tensor::empty(pool, {1000}, DType::f32, Category::staging, "stage");
  auto* dst = static_cast<std::byte*>(dense.params().raw_data());
  const size_t es = dtype_size(dense.params().dtype());
  int64_t next = 0;
  quant.read_base_range({0, dense.layout().total()},
                      [&](int64_t from, int64_t to, const void* src) {
                        EXPECT_EQ(from, next);  // consecutive runs that tile the range
                        next = to;
                        std::memcpy(dst + static_cast<size_t>(from) * es, src,
                                    static_cast<size_t>(to - from) * es);
                      },
                      staging);
  EXPECT_EQ(next, dense.layout().total());
}

class Qlora
    : public ::testing::TestWithParam<std::tuple<Family, Precision, WeightQuant>> {};

TEST_P(Qlora, StepIsTheDequantizedBaseStepWithinToleranceAndChangesOnlyTheAdapters) {
  const auto [family, precision, format] = GetParam();
  const ModelConfig c = tiny(family);
  const bool f32 = precision == Precision::fp32;
  const int B = 2, T = 160;  // 320 rows: three row tiles of a 128-row forward
  MemoryPool pool;
  LoraOptions o;
  o.rank = 4;
  o.alpha = 8;
  LoraOptions o4 = o;
  o4.base = lora_base_of(format);
  Transformer q(c, pool, precision_of(precision), quant_state(format));
  Transformer d(c, pool, precision_of(precision));     // the dequantized base
  Transformer orig(c, pool, precision_of(precision));  // the base before quantization
  q.init_weights(3);
  orig.init_weights(3);
  copy_dequantized_base(q, d, pool);
  ASSERT_NE(q.quant_base(), nullptr);
  EXPECT_EQ(q.quant_base()->format(), format);
  q.add_lora(o4, 5);
  d.add_lora(o, 5);
  orig.add_lora(o, 5);
  for (Transformer* m : {&q, &d, &orig}) {
    randomize_b(*m, o.rank);
    m->reserve(B, T);
  }
  Tensor tokens = tokens_of(pool, B, T, 0), targets = tokens_of(pool, B, T, 1);
  float loss[3];
  Transformer* models[3] = {&q, &d, &orig};
  for (int i = 0; i < 3; ++i) {
    models[i]->zero_grad();
    loss[i] = models[i]->forward(tokens, targets, true);
    models[i]->backward();
  }
  EXPECT_NEAR(loss[0], loss[1], (f32 ? 1e-5 : 1e-3) * loss[1]);
  EXPECT_NEAR(loss[0], loss[2], 5e-2 * loss[2]);
  double worst = 0;
  for (const ParamInfo& p : q.lora()->param_layout().params()) {
    const double e = rel_error(q.lora_grads().view(p.offset, p.shape),
                               d.lora_grads().view(p.offset, p.shape));
    worst = std::max(worst, e);
    EXPECT_LT(e, f32 ? 1e-4 : 2e-2) << p.name;
  }
  fmt::print("{} {} {}: quantized-base loss {:.6f}, dequantized-base LoRA {:.6f}, original "
             "base {:.6f}; worst adapter gradient error {:.2e}\n",
             family_name(family), precision_name(precision), kernels::weight_quant_name(format),
             loss[0], loss[1], loss[2], worst);

  // A step of AdamW over the adapters: the base's bytes stay.
  Tensor base = Tensor::empty(pool, {static_cast<int64_t>(q.quant_buffer().nbytes())},
                              DType::u8, Category::staging, "base");
  std::memcpy(base.raw_data(), q.quant_buffer().raw_data(), base.nbytes());
  Tensor slab = Tensor::empty(pool, {static_cast<int64_t>(q.params().nbytes())}, DType::u8,
                              Category::staging, "slab");
  std::memcpy(slab.raw_data(), q.params().raw_data(), slab.nbytes());
  Tensor adapters = Tensor::empty(pool, {q.lora()->total()}, DType::f32, Category::staging, "a");
  std::memcpy(adapters.raw_data(), q.lora_weights().raw_data(), adapters.nbytes());
  AdamW opt(OptimConfig{}, q.lora()->param_layout(), pool);
  for (int s = 0; s < 2; ++s) {
    q.zero_grad();
    (void)q.forward(tokens, targets, true);
    q.backward();
    opt.step(q.lora_weights(), q.lora_grads(), 1e-2f, 1.0f);
  }
  EXPECT_EQ(std::memcmp(q.quant_buffer().raw_data(), base.raw_data(), base.nbytes()), 0);
  EXPECT_EQ(std::memcmp(q.params().raw_data(), slab.raw_data(), slab.nbytes()), 0);
  for (const ParamInfo& p : q.lora()->param_layout().params())
    EXPECT_GT(rel_error(q.lora_weights().view(p.offset, p.shape),
                        adapters.view(p.offset, p.shape)),
              1e-4)
        << p.name;
}

// The quantization at load is the format's of each whole fused matrix of the drawn weights.
TEST_P(Qlora, LoadQuantizesEachMatrixAsTheKernelDoes) {
  const auto [family, precision, format] = GetParam();
  const ModelConfig c = tiny(family);
  MemoryPool pool;
  Transformer q(c, pool, precision_of(precision), quant_state(format));
  Transformer f(c, pool);  // f32: the drawn values
  q.init_weights(7, 100);  // a small piece: several pieces a matrix
  f.init_weights(7);
  const ModelWeights views = f.layout().views(f.params());
  for (const QuantMatrix& m : q.quant_base()->matrices()) {
    const BlockWeights& b = views.blocks[static_cast<size_t>(m.layer)];
    const Tensor& w = m.slot == LinearSlot::qkv        ? b.qkv_w
                      : m.slot == LinearSlot::attn_out ? b.attn_out_w
                      : m.slot == LinearSlot::fc       ? b.fc_w
                                                       : b.mlp_out_w;
    const auto bytes = static_cast<int64_t>(q.quant_base()->matrix_bytes(m));
    Tensor want = Tensor::empty(pool, {bytes}, DType::u8, Category::staging, "want");
    kernels::QuantWeight ww = kernels::QuantWeight::view(format, want.raw_data(), m.rows, m.cols);
    const auto floats = static_cast<int64_t>(
        kernels::quant_quantize_scratch_bytes(format, m.rows, m.cols) / 4);
    Tensor scratch = Tensor::empty(pool, {std::max<int64_t>(floats, 1)}, DType::f32,
                                   Category::staging, "scratch");
    kernels::quant_quantize(w, ww, scratch);
    EXPECT_EQ(std::memcmp(want.raw_data(),
                          static_cast<const std::byte*>(q.quant_buffer().raw_data()) + m.at,
                          static_cast<size_t>(bytes)),
              0)
        << "layer " << m.layer << " slot " << static_cast<int>(m.slot);
  }
  // The other parameters: the working copy of the drawn values.
  const ParamInfo& emb = f.layout().params().front();
  Tensor got = q.param(emb.name);
  Tensor want = Tensor::empty(pool, emb.shape, got.dtype(), Category::staging, "emb");
  kernels::convert(want, f.param(emb.name));
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0);
  EXPECT_THROW((void)q.param(family == Family::gpt2 ? "h.0.attn.c_attn.weight"
                                                    : "model.layers.0.self_attn.q_proj.weight"),
               Error);
}

// What a quantized-base model holds: the compact slab (every parameter but the block linears,
// in the working dtype), the quantized buffer, the adapters' f32 weights and gradients, AdamW's
// state over them and the plan's arenas; a step and an update allocate nothing more.
TEST_P(Qlora, PoolHoldsTheCompactSlabQuantizedBufferAdaptersTheirStateAndThePlanExactly) {
  const auto [family, precision, format] = GetParam();
  const ModelConfig c = tiny(family);
  for (const auto& [B, T] : {std::pair{2, 16}, std::pair{2, 160}}) {
    MemoryPool pool;
    LoraOptions o;
    o.rank = 4;
    o.base = lora_base_of(format);
    Transformer m(c, pool, precision_of(precision), quant_state(format));
    m.init_weights(1);
    m.add_lora(o, 1);
    m.reserve(B, T);
    AdamW opt(OptimConfig{}, m.lora()->param_layout(), pool);
    ActivationOptions options;
    options.precision = precision;
    options.lora_rank = o.rank;
    options.base_quantized = true;
    const StepPlan plan = plan_step(c, B, T, options);
    int64_t compact = 0;
    (void)m.layout().compact_offsets(&compact);
    const size_t adapters = MemoryPool::round_up(m.lora()->total() * sizeof(float));
    const std::string at = fmt::format("{} x {}", B, T);
    EXPECT_EQ(pool.bytes_current(Category::params),
              MemoryPool::round_up(compact * dtype_size(half_dtype(precision))) +
                  MemoryPool::round_up(QuantBaseLayout(c, format).bytes()) + adapters)
        << at;
    EXPECT_EQ(pool.bytes_current(Category::grads), adapters) << at;
    EXPECT_EQ(pool.bytes_current(Category::optimizer), opt.state_bytes()) << at;
    for (Category cat : {Category::activations, Category::workspace})
      EXPECT_EQ(pool.bytes_current(cat), plan.arena[static_cast<size_t>(cat)]) << at;
    bool quant = false, widen = false;
    for (const BufferSpec& b : plan.buffers) {
      quant = quant || b.tag == "ws.quant";
      widen = widen || b.tag == "ws.widen";
    }
    EXPECT_TRUE(quant) << at;
    EXPECT_FALSE(widen) << at;
    Tensor tokens = tokens_of(pool, B, T, 0);
    pool.reset_peak();  // (the load's staging is freed: the trainer test plans it)
    const size_t before = pool.bytes_current();
    m.zero_grad();
    const float loss = m.forward(tokens, tokens, true);
    m.backward();
    opt.step(m.lora_weights(), m.lora_grads(), 1e-3f, 1.0f);
    EXPECT_TRUE(std::isfinite(loss)) << at;
    EXPECT_EQ(pool.bytes_peak(), before) << at << ": a QLoRA step allocated outside the plan";
  }
}

INSTANTIATE_TEST_SUITE_P(
    FamiliesAndPrecisions, Qlora,
    ::testing::Combine(::testing::Values(Family::gpt2, Family::llama),
                       ::testing::Values(Precision::fp32, Precision::bf16),
                       ::testing::Values(WeightQuant::nf4, WeightQuant::int8)),
    [](const auto& info) {
      return fmt::format("{}_{}_{}", family_name(std::get<0>(info.param)),
                         precision_name(std::get<1>(info.param)),
                         kernels::weight_quant_name(std::get<2>(info.param)));
    });

// A quantized base is frozen LoRA's alone: without add_lora a training plan is refused, and
// add_lora's options must name the model's format (and the other way round).
TEST(QloraRefusals, TrainingWithoutAdaptersAndMismatchedOptionsAreRefused) {
  const ModelConfig c = tiny(Family::llama);
  for (const WeightQuant format : {WeightQuant::nf4, WeightQuant::int8}) {
    SCOPED_TRACE(kernels::weight_quant_name(format));
    MemoryPool pool;
    Transformer q(c, pool, precision_of(Precision::bf16), quant_state(format));
    EXPECT_THROW(q.reserve(1, 16), Error);
    LoraOptions o;
    o.rank = 2;
    EXPECT_THROW(q.add_lora(o, 1), Error);  // base precision on a quantized model
    o.base = lora_base_of(format == WeightQuant::nf4 ? WeightQuant::int8 : WeightQuant::nf4);
    EXPECT_THROW(q.add_lora(o, 1), Error);  // the other format
    Transformer d(c, pool, precision_of(Precision::bf16));
    o.base = lora_base_of(format);
    EXPECT_THROW(d.add_lora(o, 1), Error);  // quantized options on a dense model
    PrecisionOptions master;
    master.precision = Precision::bf16;
    EXPECT_THROW(Transformer(c, pool, master, quant_state(format)), Error);  // master weights
  }
}

}  // namespace
}  // namespace memfit
