// Optimizers over a range of the layout (Note [Model state]): whatever the cut, the ranges'
// optimizers together update every element exactly as the whole-layout optimizer does, their
// state is exactly the whole state's slices (state_extents), the extents tile each state
// tensor, and state bound from outside (bind_state) steps like allocated state.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/optim/optimizer.h"
#include "memfit/state/shard.h"
#include "optim_test_util.h"

namespace memfit {
namespace {

using testing::Slabs;

// "adamw:bf16" is AdamW with --optim-state-dtype bf16.
OptimConfig config_for(const std::string& name, int n_head) {
  OptimConfig c;
  c.name = name;
  if (const size_t colon = name.find(':'); colon != std::string::npos) {
    c.name = name.substr(0, colon);
    c.state_dtype = optim_state_dtype_from_name(name.substr(colon + 1));
  }
  c.n_head = n_head;
  c.seed = 7;
  return c;
}

ModelConfig llama_config() {
  ModelConfig c = ModelConfig::preset("llama-tiny");
  c.finalize();
  return c;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// The whole-layout optimizer and one optimizer per range, three steps each on the same
// gradients; the weights and every state slice must match bit for bit.
void expect_ranges_match_whole(const ModelConfig& mc, const OptimConfig& oc,
                               const std::vector<ElementRange>& ranges, bool master) {
  Slabs whole(mc), parts(mc);
  whole.fill_grads(3);
  parts.fill_grads(3);
  auto opt = make_optimizer(oc, whole.layout, whole.pool);
  std::vector<std::unique_ptr<Optimizer>> opts;
  for (const ElementRange& r : ranges) opts.push_back(make_optimizer(oc, parts.layout, &parts.pool, r));
  const int64_t n = whole.layout.total();
  Tensor work_a = Tensor::empty(whole.pool, {n}, DType::bf16, Category::params, "working");
  Tensor work_b = Tensor::empty(parts.pool, {n}, DType::bf16, Category::params, "working");
  for (int t = 0; t < 3; ++t) {
    if (master)
      opt->step_master(whole.params, work_a, whole.grads, 1e-2f, 0.5f);
    else
      opt->step(whole.params, whole.grads, 1e-2f, 0.5f);
    for (auto& o : opts) {
      const ElementRange r = o->range();
      Tensor w = parts.params.view(r.begin, {r.size()}), g = parts.grads.view(r.begin, {r.size()});
      if (master) {
        Tensor h = work_b.view(r.begin, {r.size()});
        o->step_master(w, h, g, 1e-2f, 0.5f);
      } else {
        o->step(w, g, 1e-2f, 0.5f);
      }
    }
  }
  EXPECT_TRUE(same_bytes(whole.params, parts.params)) << oc.name;
  if (master) {
    EXPECT_TRUE(same_bytes(work_a, work_b)) << oc.name;
  }
  const auto whole_state = opt->state();
  for (auto& o : opts) {
    const std::vector<ElementRange> ext = o->state_extents(o->range());
    const auto& specs = o->state_specs();
    ASSERT_EQ(specs.size(), whole_state.size());
    size_t k = 0;
    for (size_t i = 0; i < specs.size(); ++i) {
      EXPECT_EQ(specs[i].name, whole_state[i].first);
      EXPECT_EQ(specs[i].numel, ext[i].size());
      if (specs[i].numel == 0) continue;
      const auto slice = whole_state[i].second.view(ext[i].begin, {ext[i].size()});
      EXPECT_TRUE(same_bytes(slice, o->state()[k++].second))
          << oc.name << " " << specs[i].name << " of [" << o->range().begin << ", "
          << o->range().end << ")";
    }
  }
}

class EachOptimizerOverRanges : public ::testing::TestWithParam<std::string> {};

TEST_P(EachOptimizerOverRanges, ShardsUpdateAsTheWholeLayout) {
  for (const ModelConfig& mc : {testing::odd_config(), llama_config()}) {
    const OptimConfig oc = config_for(GetParam(), mc.n_head);
    for (int world : {2, 3, 5}) {
      SCOPED_TRACE(::testing::Message() << mc.d_model << " wide, " << world << " ranks");
      expect_ranges_match_whole(mc, oc, shard_ranges(ParamLayout(mc), oc, world), false);
    }
  }
}

TEST_P(EachOptimizerOverRanges, UnitsUpdateAsTheWholeLayoutWithMasterWeights) {
  const ModelConfig mc = llama_config();
  const OptimConfig oc = config_for(GetParam(), mc.n_head);
  expect_ranges_match_whole(mc, oc, unit_ranges(ParamLayout(mc)), true);
}

TEST_P(EachOptimizerOverRanges, ExtentsTileEveryStateTensor) {
  for (const ModelConfig& mc : {testing::odd_config(), llama_config()}) {
    const ParamLayout layout(mc);
    const OptimConfig oc = config_for(GetParam(), mc.n_head);
    auto whole = make_optimizer(oc, layout, nullptr);
    const auto& specs = whole->whole_state_specs();
    for (int world : {1, 2, 4, 64}) {
      const auto ranges = shard_ranges(layout, oc, world);
      std::vector<int64_t> next(specs.size(), 0);
      for (const ElementRange& r : ranges) {
        const auto ext = whole->state_extents(r);
        for (size_t i = 0; i < specs.size(); ++i) {
          EXPECT_EQ(ext[i].begin, next[i]) << specs[i].name << ", " << world << " ranks";
          EXPECT_LE(ext[i].begin, ext[i].end) << specs[i].name;
          next[i] = ext[i].end;
        }
      }
      for (size_t i = 0; i < specs.size(); ++i) EXPECT_EQ(next[i], specs[i].numel) << specs[i].name;
    }
  }
}

TEST_P(EachOptimizerOverRanges, BoundStateStepsAsAllocatedState) {
  const ModelConfig mc = llama_config();
  const OptimConfig oc = config_for(GetParam(), mc.n_head);
  Slabs a(mc), b(mc);
  a.fill_grads(5);
  b.fill_grads(5);
  const ElementRange r = block_range(a.layout, 1);
  auto own = make_optimizer(oc, a.layout, &a.pool, r);
  auto bound = make_optimizer(oc, b.layout, nullptr, r);
  EXPECT_EQ(b.pool.bytes_current(Category::optimizer), 0u);
  EXPECT_EQ(bound->state_bytes(), own->state_bytes());
  std::vector<Tensor> storage;
  for (const StateSpec& s : bound->state_specs())
    storage.push_back(s.numel ? Tensor::empty(b.pool, {s.numel}, s.dtype, Category::staging, "bound")
                              : Tensor{});
  bound->bind_state(storage);
  if (bound->scratch_elements() > 0)  // APOLLO: the scratch too, as an offloaded optimizer does
    bound->set_scratch(Tensor::empty(b.pool, {bound->scratch_elements()}, DType::f32,
                                     Category::staging, "scratch"));
  for (int t = 0; t < 2; ++t) {
    Tensor wa = a.params.view(r.begin, {r.size()}), ga = a.grads.view(r.begin, {r.size()});
    Tensor wb = b.params.view(r.begin, {r.size()}), gb = b.grads.view(r.begin, {r.size()});
    own->step(wa, ga, 1e-2f, 1.0f);
    bound->step(wb, gb, 1e-2f, 1.0f);
  }
  EXPECT_TRUE(same_bytes(a.params, b.params));
  EXPECT_EQ(bound->steps_taken(), 2);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, EachOptimizerOverRanges,
                         ::testing::Values("adamw", "adamw8bit", "lion", "lion8bit", "adam-mini",
                                           "sgd", "adamw:bf16", "adamw4bit", "apollo",
                                           "apollo-mini", "galore", "galore8bit"));

TEST(OptimizerRange, PureBf16WeightsRoundPerElementWhateverTheCut) {
  // Stochastic rounding draws element i's bits from (seed, t, i): a shard rounds as the whole
  // (AdamW, and APOLLO on its projected matrices and through AdamW's kernel elsewhere).
  const ModelConfig mc = testing::odd_config();
  for (const char* name : {"adamw", "apollo-mini", "apollo"}) {
    SCOPED_TRACE(name);
    const OptimConfig oc = config_for(name, mc.n_head);
    Slabs a(mc), b(mc);
    a.fill_grads(9);
    b.fill_grads(9);
    const int64_t n = a.layout.total();
    Tensor wa = Tensor::empty(a.pool, {n}, DType::bf16, Category::params, "w");
    Tensor wb = Tensor::empty(b.pool, {n}, DType::bf16, Category::params, "w");
    kernels::convert(wa, a.params);
    kernels::convert(wb, b.params);
    auto whole = make_optimizer(oc, a.layout, a.pool);
    whole->step(wa, a.grads, 1e-3f, 1.0f);
    for (const ElementRange& r : shard_ranges(b.layout, oc, 3)) {
      auto o = make_optimizer(oc, b.layout, &b.pool, r);
      Tensor w = wb.view(r.begin, {r.size()});
      o->step(w, b.grads.view(r.begin, {r.size()}), 1e-3f, 1.0f);
    }
    EXPECT_TRUE(same_bytes(wa, wb));
    // The weights moved (stochastic rounding keeps updates below half an ulp in expectation).
    Tensor before = Tensor::empty(b.pool, {n}, DType::bf16, Category::params, "w0");
    kernels::convert(before, a.params);
    EXPECT_FALSE(same_bytes(before, wa));
  }
}

TEST(OptimizerRange, ARangeCutInsideAStateBlockIsRefused) {
  const ModelConfig mc = testing::odd_config();
  const ParamLayout layout(mc);
  const ParamInfo* big = nullptr;
  for (const ParamInfo& p : layout.params())
    if (p.numel >= 4096) big = &p;
  ASSERT_NE(big, nullptr);
  const ElementRange r{0, big->offset + 16};  // not a multiple of 256 into an 8-bit tensor
  EXPECT_THROW(make_optimizer(config_for("adamw8bit", 4), layout, nullptr, r), Error);
  EXPECT_NO_THROW(make_optimizer(config_for("adamw", 4), layout, nullptr, r));
  EXPECT_THROW(make_optimizer(config_for("adamw", 4), layout, nullptr, ElementRange{0, layout.total() + 1}),
               Error);
}

TEST(OptimizerRange, BindStateChecksEveryTensor) {
  const ModelConfig mc = testing::odd_config();
  const ParamLayout layout(mc);
  MemoryPool pool;
  auto o = make_optimizer(config_for("adamw", 4), layout, nullptr);
  EXPECT_THROW(o->bind_state({}), Error);
  std::vector<Tensor> wrong;
  for (const StateSpec& s : o->state_specs())
    wrong.push_back(Tensor::empty(pool, {s.numel - 1}, s.dtype, Category::staging, "short"));
  EXPECT_THROW(o->bind_state(wrong), Error);
}

}  // namespace
}  // namespace memfit
