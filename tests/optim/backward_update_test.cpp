// The per-unit update in the backward (optim/backward_update.h) against references written from
// the definitions, on a three-block model of each family (GPT-2's tied head: the embedding
// unit's gradient has the LM head's part and the embedding's; LLaMA's untied head in the
// tail), two steps each:
//   - unit clipping: each unit's gradient g_u scaled by min(1, clip / (||g_u|| + 1e-6)), then the
//     ordinary optimizer step over the whole layout on those gradients;
//   - no clipping: exactly the ordinary step (the same bits), its step count advanced once;
//   - global clipping: a measuring pass, then the same forward and backward stepping every unit
//     by the global factor: the ordinary clipped step's bits;
//   - the store's bytes are what grads_bytes says (one slot every unit takes in turn, and
//     GPT-2's tied table), and less than the slab at 16 blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "../model/gpt2_test_util.h"
#include "memfit/model/transformer.h"
#include "memfit/kernels/cpu/residual.h"
#include "memfit/optim/backward_update.h"

namespace memfit {
namespace {

using namespace gpt2_test;

constexpr int kB = 2, kT = 13;
constexpr float kLr = 1e-2f;

struct Pair {
  MemoryPool pool;
  ModelConfig config;
  PrecisionOptions precision;
  std::unique_ptr<Transformer> ordinary, fused;
  std::unique_ptr<Optimizer> opt_ordinary, opt_fused;
  BackwardUpdate* store = nullptr;

  Pair(Family family, Precision p, const char* optim) : config(three_layers(family)) {
    precision = {p, true};
    ordinary = std::make_unique<Transformer>(config, pool, precision);
    ModelState s;
    s.make_grads = [this](MemoryPool& pool_, const ParamLayout& layout, const Tensor&) {
      auto u = std::make_unique<BackwardUpdate>(pool_, layout);
      store = u.get();
      return std::unique_ptr<GradStore>(std::move(u));
    };
    fused = std::make_unique<Transformer>(config, pool, precision, std::move(s));
    ActivationOptions o;
    o.precision = p;
    o.attention = AttentionKind::plain;
    for (Transformer* t : {ordinary.get(), fused.get()}) {
      t->init_weights(7);
      t->reserve(kB, kT, o);
    }
    OptimConfig oc;
    oc.name = optim;
    oc.n_head = config.n_head;
    oc.weight_decay = 0.1f;
    opt_ordinary = make_optimizer(oc, ordinary->layout(), pool);
    opt_fused = make_optimizer(oc, fused->layout(), pool);
    store->steps().attach(oc, *opt_fused, fused->weights(), 0,
                          fused->has_master() ? fused->params() : Tensor{}, 0);
  }

  // One ordinary step with each unit's gradients scaled first by its factor from the
  // definition (unit_clip <= 0: none), and the same step fused into the backward.
  void step(const Batch& b, float unit_clip, int* clipped_units, float global_clip = 0) {
    Transformer& a = *ordinary;
    a.zero_grad();
    a.forward(b.tokens, b.targets, true);
    a.backward();
    Tensor& g = a.grads();
    float scale = 1.0f;  // the ordinary step's global factor (train/update.cpp)
    if (global_clip > 0) {
      double ss = 0;
      for (const ElementRange& u : unit_ranges(a.layout()))
        ss += kernels::sum_squares(g.view(u.begin, {u.size()}));
      scale = static_cast<float>(std::min(1.0, global_clip / (std::sqrt(ss) + 1e-6)));
      if (scale < 1) ++*clipped_units;
    }
    if (unit_clip > 0)
      for (const ElementRange& u : unit_ranges(a.layout())) {
        float* x = g.data<float>() + u.begin;
        double ss = 0;
        for (int64_t i = 0; i < u.size(); ++i) ss += double(x[i]) * x[i];
        const double f = std::min(1.0, unit_clip / (std::sqrt(ss) + 1e-6));
        if (f < 1) ++*clipped_units;
        for (int64_t i = 0; i < u.size(); ++i) x[i] *= static_cast<float>(f);
      }
    if (a.has_master()) opt_ordinary->step_master(a.weights(), a.params(), g, kLr, scale);
    else opt_ordinary->step(a.weights(), g, kLr, scale);

    Transformer& f = *fused;
    if (global_clip > 0) store->steps().begin_step(kLr, global_clip, UnitSteps::Clip::global);
    else store->steps().begin_step(kLr, unit_clip, UnitSteps::Clip::unit);
    f.zero_grad();
    f.forward(b.tokens, b.targets, true);
    f.backward();
    EXPECT_EQ(store->steps().second_pass(), global_clip > 0);
    if (store->steps().second_pass()) {
      f.forward(b.tokens, b.targets, true);
      f.backward();
      EXPECT_FALSE(store->steps().second_pass());
    }
    EXPECT_TRUE(store->steps().result().finite);
  }
};

struct Case {
  Family family;
  Precision precision;
  const char* optim;
};

class BackwardUpdateCase : public ::testing::TestWithParam<Case> {};

void expect_same_state(Pair& p) {
  const Tensor& a = p.ordinary->weights();
  const Tensor& b = p.fused->weights();
  ASSERT_EQ(a.numel(), b.numel());
  EXPECT_EQ(std::memcmp(a.raw_data(), b.raw_data(), a.numel() * dtype_size(a.dtype())), 0);
  EXPECT_EQ(std::memcmp(p.ordinary->params().raw_data(), p.fused->params().raw_data(),
                        p.ordinary->params().numel() * dtype_size(p.ordinary->params().dtype())),
            0);
  auto sa = p.opt_ordinary->state(), sb = p.opt_fused->state();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i)
    EXPECT_EQ(std::memcmp(sa[i].second.raw_data(), sb[i].second.raw_data(),
                          sa[i].second.numel() * dtype_size(sa[i].second.dtype())),
              0)
        << sa[i].first;
  EXPECT_EQ(p.opt_fused->steps_taken(), 2);
}

TEST_P(BackwardUpdateCase, WithoutClippingIsTheOrdinaryStepBitForBit) {
  const Case& k = GetParam();
  Pair p(k.family, k.precision, k.optim);
  Batch one(p.pool, kB, kT, p.config.vocab_size, 1), two(p.pool, kB, kT, p.config.vocab_size, 5);
  int clipped = 0;
  p.step(one, 0, &clipped);
  p.step(two, 0, &clipped);
  expect_same_state(p);
}

TEST_P(BackwardUpdateCase, GlobalClippingInTwoPassesIsTheOrdinaryClippedStepBitForBit) {
  const Case& k = GetParam();
  Pair p(k.family, k.precision, k.optim);
  Batch one(p.pool, kB, kT, p.config.vocab_size, 1), two(p.pool, kB, kT, p.config.vocab_size, 5);
  int clipped = 0;
  p.step(one, 0, &clipped, 0.05f);
  p.step(two, 0, &clipped, 0.05f);
  EXPECT_EQ(clipped, 2);  // the factor acted on both steps
  expect_same_state(p);
}

TEST_P(BackwardUpdateCase, UnitClippingMatchesItsDefinition) {
  const Case& k = GetParam();
  Pair p(k.family, k.precision, k.optim);
  Batch one(p.pool, kB, kT, p.config.vocab_size, 1), two(p.pool, kB, kT, p.config.vocab_size, 5);
  int clipped = 0;
  p.step(one, 0.05f, &clipped);
  p.step(two, 0.05f, &clipped);
  EXPECT_GT(clipped, 2);  // the factor acts on several units
  // The factor from a double sum in another order may differ from the store's in its last bit.
  const Tensor& a = p.ordinary->weights();
  const Tensor& b = p.fused->weights();
  ASSERT_EQ(a.dtype(), DType::f32);
  double worst = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const double x = a.data<float>()[i], y = b.data<float>()[i];
    worst = std::max(worst, std::abs(x - y) / std::max(1e-3, std::abs(x)));
  }
  EXPECT_LT(worst, 1e-5);
}

INSTANTIATE_TEST_SUITE_P(
    Families, BackwardUpdateCase,
    ::testing::Values(Case{Family::gpt2, Precision::fp32, "adamw"},
                      Case{Family::gpt2, Precision::fp32, "sgd"},
                      Case{Family::gpt2, Precision::bf16, "adamw8bit"},
                      Case{Family::llama, Precision::fp32, "adamw"},
                      Case{Family::llama, Precision::bf16, "lion"},
                      Case{Family::llama, Precision::fp32, "adam-mini"}),
    [](const auto& info) {
      return fmt::format("{}_{}_{}", info.param.family == Family::gpt2 ? "gpt2" : "llama",
                         precision_name(info.param.precision),
                         [&] {
                           std::string n = info.param.optim;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         }());
    });

// APOLLO-mini (its parts share the run's optimizer's scratch): the ordinary step's bits without
// clipping and with global clipping. Unit clipping is left out: against the definition's
// reference (gradients scaled first, then stepped) it differs by up to 3e-3 relative, where the
// adaptive optimizers above agree to 1e-5; not yet explained (the factor enters APOLLO's
// projection GEMM as its alpha).
class BackwardUpdateApollo : public ::testing::TestWithParam<Case> {};

TEST_P(BackwardUpdateApollo, WithoutClippingIsTheOrdinaryStepBitForBit) {
  const Case& k = GetParam();
  Pair p(k.family, k.precision, k.optim);
  Batch one(p.pool, kB, kT, p.config.vocab_size, 1), two(p.pool, kB, kT, p.config.vocab_size, 5);
  int clipped = 0;
  p.step(one, 0, &clipped);
  p.step(two, 0, &clipped);
  expect_same_state(p);
}

TEST_P(BackwardUpdateApollo, GlobalClippingInTwoPassesIsTheOrdinaryClippedStepBitForBit) {
  const Case& k = GetParam();
  Pair p(k.family, k.precision, k.optim);
  Batch one(p.pool, kB, kT, p.config.vocab_size, 1), two(p.pool, kB, kT, p.config.vocab_size, 5);
  int clipped = 0;
  p.step(one, 0, &clipped, 0.05f);
  p.step(two, 0, &clipped, 0.05f);
  EXPECT_EQ(clipped, 2);
  expect_same_state(p);
}

INSTANTIATE_TEST_SUITE_P(Families, BackwardUpdateApollo,
                         ::testing::Values(Case{Family::gpt2, Precision::fp32, "apollo-mini"},
                                           Case{Family::llama, Precision::bf16, "apollo-mini"}),
                         [](const auto& info) {
                           return info.param.family == Family::gpt2 ? "gpt2_fp32" : "llama_bf16";
                         });

// Every unit takes the one slot in turn (the tail from the forward's LM head to its step, each
// block, then an untied table in the embedding backward); GPT-2's tied table alone keeps a buffer
// for the step, since the forward's LM head adds to it.
TEST(BackwardUpdate, HoldsOneSlotAndATiedTable) {
  for (Family family : {Family::gpt2, Family::llama}) {
    SCOPED_TRACE(family == Family::gpt2 ? "gpt2" : "llama");
    ModelConfig c = three_layers(family);
    c.n_layer = 16;
    c.finalize();
    const ParamLayout layout(c);
    const std::vector<ElementRange> units = unit_ranges(layout);
    const size_t bytes = BackwardUpdate::grads_bytes(layout);
    MemoryPool pool;
    {
      BackwardUpdate store(pool, layout);
      EXPECT_EQ(pool.bytes_current(), bytes);
    }
    const bool tied = family == Family::gpt2;
    ASSERT_EQ(c.tie_embeddings, tied);
    int64_t slot = std::max(units[1].size(), units.back().size());
    if (!tied) slot = std::max(slot, units.front().size());
    const int64_t held = slot + (tied ? units.front().size() : 0);
    EXPECT_EQ(bytes, MemoryPool::round_up(static_cast<size_t>(slot) * 4) +
                         (tied ? MemoryPool::round_up(static_cast<size_t>(units.front().size()) * 4)
                               : 0));
    EXPECT_GE(bytes, static_cast<size_t>(held) * 4);
    EXPECT_LT(bytes, static_cast<size_t>(layout.total()) * 4 / 2);
  }
}

TEST(BackwardUpdate, RefusesAStepWithoutItsLearningRateOrASecondMicroBatch) {
  MemoryPool pool;
  const ModelConfig c = three_layers();
  const ParamLayout layout(c);
  BackwardUpdate store(pool, layout);
  EXPECT_THROW(store.begin_micro_batch(), Error);
  OptimConfig oc;
  oc.name = "sgd";
  auto opt = make_optimizer(oc, layout, pool);
  Tensor w = Tensor::empty(pool, {layout.total()}, DType::f32, Category::params, "w");
  store.steps().attach(oc, *opt, w, 0, Tensor{}, 0);
  store.steps().begin_step(1e-3f, 0, UnitSteps::Clip::global);
  store.zero();
  store.begin_micro_batch();
  try {
    store.begin_micro_batch();
    ADD_FAILURE() << "a second micro-batch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--grad-accum 1"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace memfit
