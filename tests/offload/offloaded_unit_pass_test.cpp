// The offloaded optimizer stepped a unit at a time in the backward's order (offloaded_unit_pass.cpp,
// Note [Update in backward], "With offload"): through UnitSteps, as --update-in-backward drives
// it, the working weights, the master weights and the saved state are the bytes of the ordinary
// streamed step on the same gradients, for element-wise, 8-bit and low-state optimizers, with
// and without master weights, with units cut into many pieces, and over a ZeRO rank's shard cut
// inside units; a non-finite unit leaves its state and weights as they were; units out of the
// backward's order are refused.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#include "memfit/offload/offloaded_optimizer.h"
#include "memfit/optim/unit_steps.h"
#include "memfit/state/shard.h"
#include "offload_test_util.h"

namespace memfit::offload {
namespace {

struct PassCase {
  std::string optim;
  bool master;
};

class OffloadedUnitPass : public ::testing::TestWithParam<PassCase> {};

// One step of `steps` over `grads` in the backward's order of units (the tail first).
void backward_step(UnitSteps& steps, const ParamLayout& layout, const Tensor& grads, float lr) {
  steps.begin_step(lr, 0, UnitSteps::Clip::global);
  steps.begin_micro_batch();
  const std::vector<ElementRange> units = unit_ranges(layout);
  for (size_t u = units.size(); u-- > 0;)
    steps.unit_done(u, grads.view(units[u].begin, {units[u].size()}));
  steps.end_backward();
}

TEST_P(OffloadedUnitPass, StepsAsTheStreamedUpdate) {
  const PassCase c = GetParam();
  TempDir tmp;
  const ModelConfig mc = llama();
  const ParamLayout layout(mc);
  OptimConfig oc;
  oc.name = c.optim;
  oc.n_head = mc.n_head;
  oc.seed = 5;
  const int64_t n = layout.total();
  MemoryPool pool;
  const DType working = c.master ? DType::bf16 : DType::f32;
  Tensor w = Tensor::empty(pool, {n}, DType::f32, Category::workspace, "w");
  Tensor h_whole = Tensor::empty(pool, {n}, working, Category::params, "h");
  Tensor h_units = Tensor::empty(pool, {n}, working, Category::params, "h");
  Tensor grads = Tensor::empty(pool, {n}, DType::f32, Category::grads, "g");
  fill(w, 7, 1.0f);
  // Pieces of at most 3000 elements (cut where the state allows): every unit is many pieces, so
  // the ring's reads run across units.
  OffloadedOptimizer whole(oc, layout, c.master, pool, tmp.path, "whole", 3000);
  OffloadedOptimizer units(oc, layout, c.master, pool, tmp.path, "units", 3000);
  ASSERT_GT(units.file_layout().pieces.size(), unit_ranges(layout).size());
  if (c.master) {  // (the working copy is rounded from the master weights by every step)
    whole.write_master(w);
    units.write_master(w);
    std::memset(h_whole.raw_data(), 0, h_whole.nbytes());
  } else {
    std::memcpy(h_whole.raw_data(), w.raw_data(), w.nbytes());
  }
  std::memcpy(h_units.raw_data(), h_whole.raw_data(), h_whole.nbytes());
  UnitSteps steps(layout, whole_range(layout));
  units.attach_backward(h_units);
  steps.attach(units);
  for (int t = 0; t < 3; ++t) {
    fill(grads, 300 + t, 0.2f);
    whole.step(h_whole, grads, 1e-2f, 1.0f);
    backward_step(steps, layout, grads, 1e-2f);
    EXPECT_TRUE(steps.result().finite);
  }
  EXPECT_EQ(units.steps_taken(), 3);
  EXPECT_TRUE(same_bytes(h_whole, h_units));
  if (c.master) {
    Tensor a = Tensor::empty(pool, {n}, DType::f32, Category::workspace, "a");
    Tensor b = Tensor::empty(pool, {n}, DType::f32, Category::workspace, "b");
    whole.read_master(a);
    units.read_master(b);
    EXPECT_TRUE(same_bytes(a, b));
  }
  whole.save_state(tmp.path / "whole.safetensors");
  units.save_state(tmp.path / "units.safetensors");
  EXPECT_EQ(first_difference(tmp.path / "whole.safetensors", tmp.path / "units.safetensors"), "");
  // The same bytes moved: every piece read and written once a step.
  EXPECT_EQ(whole.stats().bytes_read, units.stats().bytes_read);
  EXPECT_EQ(whole.stats().bytes_written, units.stats().bytes_written);
}

INSTANTIATE_TEST_SUITE_P(Optimizers, OffloadedUnitPass,
                         ::testing::Values(PassCase{"adamw", false}, PassCase{"adamw", true},
                                           PassCase{"adamw8bit", false},
                                           PassCase{"adamw8bit", true},
                                           PassCase{"apollo-mini", true},
                                           PassCase{"adam-mini", false}),
                         [](const ::testing::TestParamInfo<PassCase>& info) {
                           std::string s = info.param.optim + (info.param.master ? "_master" : "");
                           for (char& ch : s)
                             if (ch == '-') ch = '_';
                           return s;
                         });

// Over a ZeRO rank's shard (--update-in-backward with the optimizer offloaded under ZeRO 2-3):
// the middle of three shards, cut inside units, its pieces the units' parts in it; each unit's
// part given as the per-unit reduction gives it (a unit outside the shard: nothing). The
// working and master weights and the bytes moved are the ordinary streamed step's over the
// same shard.
TEST(OffloadedUnitPassShard, OverAShardStepsAsTheStreamedUpdate) {
  TempDir tmp;
  const ModelConfig mc = llama();
  const ParamLayout layout(mc);
  OptimConfig oc;
  oc.name = "adamw8bit";
  const ElementRange R = shard_ranges(layout, oc, 3)[1];
  const std::vector<ElementRange> units = unit_ranges(layout);
  int cut = 0;
  for (const ElementRange& u : units) cut += u.begin < R.begin && R.begin < u.end;
  ASSERT_GT(cut, 0) << "the shard starts at a unit's edge";
  MemoryPool pool;
  Tensor w = Tensor::empty(pool, {R.size()}, DType::f32, Category::workspace, "w");
  Tensor h_whole = Tensor::empty(pool, {R.size()}, DType::bf16, Category::params, "h");
  Tensor h_units = Tensor::empty(pool, {R.size()}, DType::bf16, Category::params, "h");
  Tensor grads = Tensor::empty(pool, {R.size()}, DType::f32, Category::grads, "g");
  fill(w, 7, 1.0f);
  OffloadedOptimizer whole(oc, layout, true, pool, tmp.path, "whole", 3000, R);
  OffloadedOptimizer parts(oc, layout, true, pool, tmp.path, "parts", 3000, R);
  whole.write_master(w);
  parts.write_master(w);
  std::memset(h_whole.raw_data(), 0, h_whole.nbytes());
  std::memset(h_units.raw_data(), 0, h_units.nbytes());
  UnitSteps steps(layout, R);
  parts.attach_backward(h_units);
  steps.attach(parts);
  for (int t = 0; t < 3; ++t) {
    fill(grads, 300 + t, 0.2f);
    whole.step(h_whole, grads, 1e-2f, 1.0f);
    steps.begin_step(1e-2f, 0, UnitSteps::Clip::global);
    steps.begin_micro_batch();
    for (size_t u = units.size(); u-- > 0;) {
      const ElementRange part = R.intersect(units[u]);
      steps.unit_done(u, part.empty() ? grads.view(0, {0})
                                      : grads.view(part.begin - R.begin, {part.size()}));
    }
    steps.end_backward();
    EXPECT_TRUE(steps.result().finite);
  }
  EXPECT_TRUE(same_bytes(h_whole, h_units));
  Tensor a = Tensor::empty(pool, {R.size()}, DType::f32, Category::workspace, "a");
  Tensor b = Tensor::empty(pool, {R.size()}, DType::f32, Category::workspace, "b");
  whole.read_master(a);
  parts.read_master(b);
  EXPECT_TRUE(same_bytes(a, b));
  // (The state of a shard is saved as a ZeRO shard file; the end-to-end test compares those:
  // tests/cli/zero_update_in_backward_test.cpp.) The same bytes moved.
  EXPECT_EQ(whole.stats().bytes_read, parts.stats().bytes_read);
  EXPECT_EQ(whole.stats().bytes_written, parts.stats().bytes_written);
}

TEST(OffloadedUnitPassChecks, ANonFiniteUnitIsLeftAndOrderIsChecked) {
  TempDir tmp;
  const ModelConfig mc = llama();
  const ParamLayout layout(mc);
  OptimConfig oc;
  oc.name = "adamw8bit";
  const int64_t n = layout.total();
  MemoryPool pool;
  Tensor h = Tensor::empty(pool, {n}, DType::f32, Category::params, "h");
  Tensor before = Tensor::empty(pool, {n}, DType::f32, Category::workspace, "before");
  Tensor grads = Tensor::empty(pool, {n}, DType::f32, Category::grads, "g");
  fill(h, 1, 1.0f);
  std::memcpy(before.raw_data(), h.raw_data(), h.nbytes());
  OffloadedOptimizer off(oc, layout, false, pool, tmp.path, "t", 3000);
  UnitSteps steps(layout, whole_range(layout));
  off.attach_backward(h);
  steps.attach(off);
  const std::vector<ElementRange> units = unit_ranges(layout);
  fill(grads, 2, 0.2f);
  const ElementRange bad = units[1];  // block 0
  grads.data<float>()[bad.begin + 3] = std::numeric_limits<float>::quiet_NaN();
  backward_step(steps, layout, grads, 1e-2f);
  EXPECT_FALSE(steps.result().finite);
  // Block 0 as it was; the tail stepped.
  EXPECT_EQ(std::memcmp(h.data<float>() + bad.begin, before.data<float>() + bad.begin,
                        static_cast<size_t>(bad.size()) * 4),
            0);
  const ElementRange tail = units.back();
  EXPECT_NE(std::memcmp(h.data<float>() + tail.begin, before.data<float>() + tail.begin,
                        static_cast<size_t>(tail.size()) * 4),
            0);
  // Out of order: the embeddings before the tail.
  steps.begin_step(1e-2f, 0, UnitSteps::Clip::global);
  steps.begin_micro_batch();
  fill(grads, 3, 0.2f);
  EXPECT_THROW(steps.unit_done(0, grads.view(units[0].begin, {units[0].size()})), Error);
}

}  // namespace
}  // namespace memfit::offload
