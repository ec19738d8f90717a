// --precision fp8's stored working weights (model/fp8_weights.h; Note [FP8], "Storage"): the
// blocks' linears as E4M3 codes with a scale per matrix, encoded from the f32 master weights.
// Checked here: the layout of the matrices (fused groups as one matrix, 64-byte aligned codes,
// the scales after them); after an update, the stored codes and scale are a reference
// quantization of the master written from the rule's definition; a model that stores them
// computes the same bits as one that keeps bf16 working weights and casts them (today's fp8
// path), over two steps of AdamW, on both families; refreshing unit by unit (the update in the
// backward) gives the whole refresh's bytes; the pool holds one byte a linear weight.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "memfit/kernels/ref/fp8_ref.h"
#include "memfit/model/fp8_weights.h"
#include "memfit/model/transformer.h"
#include "memfit/optim/optimizer.h"
#include "gpt2_test_util.h"

namespace memfit {
namespace {

using namespace gpt2_test;

ModelState stored() {
  ModelState s;
  s.params_fp8 = true;
  return s;
}

// Master weights from init_weights(21) plus noise (weights larger than the init's).
void perturb(Transformer& gpt, uint32_t seed) {
  gpt.init_weights(21);
  std::mt19937 rng(seed);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  float* w = gpt.weights().data<float>();
  for (int64_t i = 0; i < gpt.weights().numel(); ++i) w[i] += noise(rng);
  gpt.refresh_working();
}

// The rule from its definition, in double where it can be: amax over the matrix's master
// values, rounded to bf16 (the amax of the bf16 copy); the scale 2^floor(log2(448 / amax));
// each code the nearest E4M3 code (kernels/ref/fp8_ref.h's search) to bf16(w) x scale.
void expect_reference_codes(const Transformer& gpt) {
  const Fp8WeightLayout& L = *gpt.fp8_weights();
  const float* master = const_cast<Transformer&>(gpt).weights().data<float>();
  const float* scales = L.scales(gpt.fp8_buffer()).data<float>();
  for (const Fp8Matrix& m : L.matrices()) {
    SCOPED_TRACE(testing::Message() << "layer " << m.layer << " slot " << int(m.slot));
    const float* w = master + m.layout_offset;
    const int64_t n = m.rows * m.cols;
    double amax = 0;
    for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(double(w[i])));
    const double a16 = f32_from_bf16(bf16_from_f32(static_cast<float>(amax)));
    const double scale = std::exp2(std::floor(std::log2(448.0 / a16)));
    ASSERT_EQ(double(scales[m.index]), scale);
    const auto* codes = static_cast<const uint8_t*>(L.codes(gpt.fp8_buffer(), m).raw_data());
    for (int64_t i = 0; i < n; ++i) {
      const double y = double(f32_from_bf16(bf16_from_f32(w[i]))) * scale;
      ASSERT_EQ(codes[i], kernels::ref::fp8_encode_ref(kernels::Fp8Format::e4m3, y)) << "at " << i;
    }
  }
  // The rest of the layout: the master rounded to bf16, in the compact slab.
  const auto& ps = gpt.layout().params();
  const auto* h = static_cast<const uint16_t*>(const_cast<Transformer&>(gpt).params().raw_data());
  for (size_t i = 0; i < ps.size(); ++i) {
    const int64_t at = gpt.working_offset(i);
    if (at < 0) continue;
    for (int64_t k = 0; k < ps[i].numel; ++k)
      ASSERT_EQ(h[at + k], bf16_from_f32(master[ps[i].offset + k])) << ps[i].name;
  }
}

class Fp8Weights : public ::testing::TestWithParam<Family> {};

TEST_P(Fp8Weights, LayoutHasOneMatrixPerLinearWithFusedGroupsWhole) {
  const ModelConfig c = odd_config(GetParam());
  const ParamLayout layout(c);
  const Fp8WeightLayout L(layout);
  ASSERT_EQ(L.matrices().size(), static_cast<size_t>(c.n_layer) * kLinearSlots);
  int64_t linear = 0;
  for (const ParamInfo& p : layout.params())
    if (p.layer >= 0 && is_linear_weight(p.role)) linear += p.numel;
  EXPECT_EQ(L.numel(), linear);
  const int64_t C = c.d_model;
  const int64_t want[kLinearSlots][2] = {
      {c.qkv_width(), C}, {C, c.attn_width()}, {c.fc_width(), C}, {C, c.ffn_dim}};
  for (const Fp8Matrix& m : L.matrices()) {
    EXPECT_EQ(m.rows, want[int(m.slot)][0]);
    EXPECT_EQ(m.cols, want[int(m.slot)][1]);
    EXPECT_EQ(m.at % 64, 0u);
    EXPECT_EQ(m.index, static_cast<size_t>(m.layer) * kLinearSlots + size_t(m.slot));
  }
  EXPECT_EQ(L.scales_at() % 64, 0u);
  EXPECT_GE(L.scales_at(), static_cast<size_t>(L.numel()));
  EXPECT_EQ(L.bytes(), L.scales_at() + L.matrices().size() * 4);
}

// Two training steps of AdamW from the same start: the stored model and today's (bf16 working
// weights, cast by the forward and backward) give the same loss and gradients, bit for bit;
// after each update the stored codes are the reference quantization of the master.
TEST_P(Fp8Weights, StepsEqualTheCastPathAndCodesAreTheReferenceQuantization) {
  const ModelConfig c = odd_config(GetParam());
  for (uint32_t seed : {5u, 6u}) {
    SCOPED_TRACE(testing::Message() << "seed " << seed);
    MemoryPool pool_a, pool_b;
    Transformer cast(c, pool_a, {Precision::fp8, true});
    Transformer store(c, pool_b, {Precision::fp8, true}, stored());
    ASSERT_NE(store.fp8_weights(), nullptr);
    ASSERT_EQ(cast.fp8_weights(), nullptr);
    perturb(cast, seed);
    perturb(store, seed);
    expect_reference_codes(store);
    cast.reserve(3, 13, ActivationOptions{});
    store.reserve(3, 13, ActivationOptions{});
    OptimConfig oc;
    auto opt_a = make_optimizer(oc, cast.layout(), pool_a);
    auto opt_b = make_optimizer(oc, store.layout(), pool_b);
    Batch b(pool_a, 3, 13, c.vocab_size, seed + 3);
    for (int step = 0; step < 2; ++step) {
      SCOPED_TRACE(testing::Message() << "step " << step);
      cast.zero_grad();
      store.zero_grad();
      const float la = cast.forward(b.tokens, b.targets, true);
      cast.backward();
      const float lb = store.forward(b.tokens, b.targets, true);
      store.backward();
      EXPECT_EQ(la, lb);
      ASSERT_EQ(cast.grads().numel(), store.grads().numel());
      EXPECT_EQ(std::memcmp(cast.grads().raw_data(), store.grads().raw_data(),
                            cast.grads().nbytes()),
                0);
      // The ordinary update of each: the master and bf16 copy in one pass, and the master
      // then the stored copy (train/update.cpp).
      opt_a->step_master(cast.weights(), cast.params(), cast.grads(), 1e-2f, 1.0f);
      opt_b->step(store.weights(), store.grads(), 1e-2f, 1.0f);
      store.refresh_working();
      EXPECT_EQ(std::memcmp(cast.weights().raw_data(), store.weights().raw_data(),
                            cast.weights().nbytes()),
                0);
      expect_reference_codes(store);
    }
  }
}

// --update-in-backward refreshes each unit as it is stepped: unit by unit gives the whole
// refresh's bytes, and a unit's refresh touches its own matrices alone.
TEST_P(Fp8Weights, RefreshByUnitsEqualsTheWholeRefresh) {
  const ModelConfig c = odd_config(GetParam());
  MemoryPool pool;
  Transformer gpt(c, pool, {Precision::fp8, true}, stored());
  perturb(gpt, 9);
  const Tensor& buf = gpt.fp8_buffer();
  const std::vector<uint8_t> whole(static_cast<const uint8_t*>(buf.raw_data()),
                                   static_cast<const uint8_t*>(buf.raw_data()) + buf.nbytes());
  std::memset(buf.raw_data(), 0, buf.nbytes());
  const std::vector<ElementRange> units = unit_ranges(gpt.layout());
  gpt.refresh_working(units[2]);  // block 1 alone
  const Fp8WeightLayout& L = *gpt.fp8_weights();
  const auto* got = static_cast<const uint8_t*>(buf.raw_data());
  for (const Fp8Matrix& m : L.matrices()) {
    const uint8_t* codes = got + m.at;
    const bool mine = m.layer == 1;
    int64_t nonzero = 0;
    for (int64_t i = 0; i < m.rows * m.cols; ++i) nonzero += codes[i] != 0;
    EXPECT_EQ(nonzero > 0, mine) << "layer " << m.layer;
  }
  for (const ElementRange& u : units) gpt.refresh_working(u);
  EXPECT_EQ(std::memcmp(whole.data(), buf.raw_data(), whole.size()), 0);
}

// params: the compact bf16 slab and one byte a linear weight plus the scales, against bf16's
// whole slab.
TEST_P(Fp8Weights, PoolHoldsOneByteALinearWeight) {
  const ModelConfig c = odd_config(GetParam());
  MemoryPool pool_a, pool_b;
  Transformer cast(c, pool_a, {Precision::fp8, true});
  Transformer store(c, pool_b, {Precision::fp8, true}, stored());
  int64_t compact = 0;
  (void)store.layout().compact_offsets(&compact);
  const Fp8WeightLayout L(store.layout());
  EXPECT_EQ(pool_b.bytes_current(Category::params),
            MemoryPool::round_up(static_cast<size_t>(compact) * 2) +
                MemoryPool::round_up(L.bytes()));
  EXPECT_EQ(pool_a.bytes_current(Category::params),
            MemoryPool::round_up(static_cast<size_t>(c.num_params()) * 2));
  EXPECT_LT(pool_b.bytes_current(Category::params), pool_a.bytes_current(Category::params));
  EXPECT_EQ(pool_b.bytes_current(Category::master), pool_a.bytes_current(Category::master));
  EXPECT_THROW(store.param(store.layout().params()[2 + (GetParam() == Family::gpt2 ? 2 : 0)].name),
               Error);
}

// A shard of master weights (ZeRO stages 1-2) is built, and refreshed by the ranks' exchange
// alone (tests/model/fp8_shard_test.cpp, tests/dist/fp8_publish_test.cpp).
TEST(Fp8WeightsModel, NeedsFp8WithMasterWeightsInRamAndTheWorkingWeightsWhole) {
  const ModelConfig c = odd_config(Family::gpt2);
  MemoryPool pool;
  EXPECT_THROW((void)Transformer(c, pool, {Precision::bf16, true}, stored()), Error);
  ModelState shard = stored();
  shard.master_range = ElementRange{0, 64};
  {
    Transformer s(c, pool, {Precision::fp8, true}, shard);
    ASSERT_NE(s.fp8_weights(), nullptr);
    EXPECT_THROW(s.refresh_working(), Error);
  }
  ModelState offloaded = stored();
  offloaded.master_in_ram = false;
  EXPECT_THROW((void)Transformer(c, pool, {Precision::fp8, true}, offloaded), Error);
}

INSTANTIATE_TEST_SUITE_P(Families, Fp8Weights, ::testing::Values(Family::gpt2, Family::llama),
                         [](const auto& info) { return std::string(family_name(info.param)); });

}  // namespace
}  // namespace memfit
