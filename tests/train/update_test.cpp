// apply_update, the end of every training step, on gradients set by hand: an fp16 overflow
// skips the step leaving weights, working copy and optimizer state bit for bit as they were
// while the scaler backs off as configured; a clean step updates and refreshes the working copy;
// without a scaler a non-finite gradient changes nothing; the reported norm is that of the
// unscaled mean gradient, and clipping scales the update to it.
#include "memfit/train/update.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

namespace memfit {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

ModelConfig small_config() {
  ModelConfig c;
  c.n_layer = 2;
  c.n_head = 3;
  c.d_model = 24;
  c.max_seq_len = 16;
  c.vocab_size = 70;
  c.finalize();
  return c;
}

std::vector<unsigned char> bytes_of(const Tensor& t) {
  const auto* p = static_cast<const unsigned char*>(t.raw_data());
  return std::vector<unsigned char>(p, p + t.nbytes());
}

// Everything an update may change, as bytes.
struct Snapshot {
  std::vector<unsigned char> weights, working;
  std::vector<std::vector<unsigned char>> state;
  int64_t steps_taken;
};
Snapshot snapshot(Transformer& gpt, Optimizer& opt) {
  Snapshot s{bytes_of(gpt.weights()), bytes_of(gpt.params()), {}, opt.steps_taken()};
  for (auto& [name, t] : opt.state()) s.state.push_back(bytes_of(t));
  return s;
}
::testing::AssertionResult unchanged(const Snapshot& before, const Snapshot& now) {
  if (now.weights != before.weights) return ::testing::AssertionFailure() << "weights changed";
  if (now.working != before.working) return ::testing::AssertionFailure() << "working changed";
  if (now.state.size() != before.state.size())
    return ::testing::AssertionFailure() << "optimizer state tensors changed in number";
  for (size_t i = 0; i < now.state.size(); ++i)
    if (now.state[i] != before.state[i])
      return ::testing::AssertionFailure() << "optimizer state tensor " << i << " changed";
  if (now.steps_taken != before.steps_taken)
    return ::testing::AssertionFailure() << "optimizer steps_taken changed";
  return ::testing::AssertionSuccess();
}

// The gradient slab comes with the step plan (plain attention: fp16 has no flash path).
void reserve_step(Transformer& gpt) {
  ActivationOptions o;
  o.attention = AttentionKind::plain;
  gpt.reserve(1, 8, o);
}

// Gradients of a plausible size (normal(0, 1e-2)) times `scale`, seeded.
void fill_grads(Transformer& gpt, float scale, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1e-2f);
  float* g = gpt.grads().data<float>();
  for (int64_t i = 0; i < gpt.grads().numel(); ++i) g[i] = dist(rng) * scale;
}

// Elements of the working copy that are not the weights of record rounded to nearest even.
int64_t working_mismatches(Transformer& gpt) {
  const float* m = gpt.weights().data<float>();
  const auto* w = static_cast<const uint16_t*>(gpt.params().raw_data());
  const bool f16 = gpt.params().dtype() == DType::f16;
  int64_t bad = 0;
  for (int64_t i = 0; i < gpt.weights().numel(); ++i)
    bad += w[i] != (f16 ? f16_from_f32(m[i]) : bf16_from_f32(m[i]));
  return bad;
}

TEST(ApplyUpdate, AnFp16OverflowSkipsTheStepAndTouchesNothing) {
  MemoryPool pool;
  Transformer gpt(small_config(), pool, {Precision::fp16, true});
  gpt.init_weights(1);
  reserve_step(gpt);
  std::unique_ptr<Optimizer> opt = make_optimizer(OptimConfig{}, gpt.layout(), pool);
  LossScalerConfig sc;
  sc.initial_scale = 1024.0f;
  sc.hysteresis = 2;
  sc.window = 3;
  DynamicLossScaler scaler(sc);

  // A clean step first, so that the optimizer state is not all zeros.
  fill_grads(gpt, scaler.scale(), 1);
  UpdateOutcome o = apply_update(gpt, *opt, &scaler, 1e-3f, 1.0f, 1);
  ASSERT_FALSE(o.skipped);
  ASSERT_EQ(scaler.clean_steps(), 1);
  const Snapshot before = snapshot(gpt, *opt);
  const int64_t poisoned = gpt.layout().find("h.1.mlp.c_fc.weight").offset + 7;

  // Overflows: the first spends the hysteresis, each one after it halves the scale.
  const float want_scale[] = {1024.0f, 512.0f, 256.0f};
  const int want_left[] = {1, 0, 0};
  for (int k = 0; k < 3; ++k) {
    SCOPED_TRACE(fmt::format("overflow {}", k + 1));
    fill_grads(gpt, scaler.scale(), 10 + k);
    gpt.grads().data<float>()[poisoned] = k == 2 ? kNaN : (k == 0 ? kInf : -kInf);
    o = apply_update(gpt, *opt, &scaler, 1e-3f, 1.0f, 1);
    EXPECT_TRUE(o.skipped);
    EXPECT_FALSE(o.non_finite);
    EXPECT_TRUE(std::isnan(o.grad_norm));
    EXPECT_TRUE(unchanged(before, snapshot(gpt, *opt)));
    EXPECT_EQ(scaler.scale(), want_scale[k]);
    EXPECT_EQ(scaler.hysteresis_left(), want_left[k]);
    EXPECT_EQ(scaler.clean_steps(), 0);
    EXPECT_EQ(scaler.skipped(), k + 1);
  }

  // A clean step updates the master weights, the optimizer state and the working copy, which
  // is then the master rounded to nearest even.
  fill_grads(gpt, scaler.scale(), 20);
  o = apply_update(gpt, *opt, &scaler, 1e-3f, 1.0f, 1);
  EXPECT_FALSE(o.skipped);
  EXPECT_TRUE(std::isfinite(o.grad_norm));
  const Snapshot after = snapshot(gpt, *opt);
  EXPECT_NE(after.weights, before.weights);
  EXPECT_NE(after.working, before.working);
  EXPECT_NE(after.state, before.state);
  EXPECT_EQ(after.steps_taken, before.steps_taken + 1);
  EXPECT_EQ(working_mismatches(gpt), 0);
  EXPECT_EQ(scaler.scale(), 256.0f);
  EXPECT_EQ(scaler.clean_steps(), 1);
}

TEST(ApplyUpdate, WithoutAScalerANonFiniteGradientChangesNothing) {
  const PrecisionOptions modes[] = {
      {Precision::fp32, true}, {Precision::bf16, true}, {Precision::bf16, false}};
  for (const PrecisionOptions& mode : modes) {
    SCOPED_TRACE(fmt::format("{}, master weights {}", precision_name(mode.precision),
                             mode.master_weights));
    MemoryPool pool;
    Transformer gpt(small_config(), pool, mode);
    gpt.init_weights(2);
    reserve_step(gpt);
    std::unique_ptr<Optimizer> opt = make_optimizer(OptimConfig{}, gpt.layout(), pool);
    fill_grads(gpt, 1.0f, 3);
    ASSERT_FALSE(apply_update(gpt, *opt, nullptr, 1e-3f, 1.0f, 1).non_finite);
    const Snapshot before = snapshot(gpt, *opt);
    for (float bad : {kInf, kNaN}) {
      fill_grads(gpt, 1.0f, 4);
      gpt.grad("wpe.weight").data<float>()[5] = bad;
      UpdateOutcome o = apply_update(gpt, *opt, nullptr, 1e-3f, 1.0f, 1);
      EXPECT_TRUE(o.non_finite);
      EXPECT_FALSE(o.skipped);
      EXPECT_FALSE(std::isfinite(o.grad_norm));
      EXPECT_TRUE(unchanged(before, snapshot(gpt, *opt)));
    }
    fill_grads(gpt, 1.0f, 5);
    EXPECT_FALSE(apply_update(gpt, *opt, nullptr, 1e-3f, 1.0f, 1).non_finite);
    EXPECT_NE(snapshot(gpt, *opt).weights, before.weights);
    if (gpt.precision().master_weights && mode.precision != Precision::fp32) {
      EXPECT_EQ(working_mismatches(gpt), 0);
    }
  }
}

// The gradient slab holds the sum of two micro-batches' gradients times the loss scale 2^12.
// grad_norm must be the 2-norm of their mean, unscaled; with clip at half of it, SGD (no
// momentum, no decay) moves each weight by lr times the mean gradient times clip / norm.
TEST(ApplyUpdate, GradNormIsTheUnscaledMeanGradientsNormAndClippingUsesIt) {
  constexpr int kAccum = 2;
  constexpr float kScale = 4096.0f;
  constexpr float kLr = 0.1f;
  for (bool with_scaler : {true, false}) {
    SCOPED_TRACE(with_scaler ? "fp16 with a loss scale of 2^12" : "fp32 without a scaler");
    MemoryPool pool;
    Transformer gpt(small_config(), pool,
             {with_scaler ? Precision::fp16 : Precision::fp32, true});
    gpt.init_weights(6);
    reserve_step(gpt);
    OptimConfig oc;
    oc.name = "sgd";
    oc.weight_decay = 0.0f;
    std::unique_ptr<Optimizer> opt = make_optimizer(oc, gpt.layout(), pool);
    LossScalerConfig sc;
    sc.initial_scale = kScale;
    DynamicLossScaler scaler(sc);
    const float scale = with_scaler ? kScale : 1.0f;

    // Two micro-batches' gradients a and b; the slab holds (a + b) * scale, exactly as stored.
    // The slab's alignment padding between tensors stays zero, as a backward leaves it.
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 1e-2f);
    const int64_t n = gpt.grads().numel();
    std::vector<double> mean(n, 0.0);
    double sum_sq = 0;
    float* g = gpt.grads().data<float>();
    for (const ParamInfo& p : gpt.layout().params()) {
      for (int64_t i = p.offset; i < p.offset + p.numel; ++i) {
        const float a = dist(rng), b = dist(rng);
        g[i] = (a + b) * scale;
        mean[i] = double(g[i]) / scale / kAccum;  // exact: powers of two
        sum_sq += mean[i] * mean[i];
      }
    }
    const double norm = std::sqrt(sum_sq);
    const float clip = static_cast<float>(norm / 2);
    const std::vector<float> w0(gpt.weights().data<float>(), gpt.weights().data<float>() + n);

    UpdateOutcome o = apply_update(gpt, *opt, with_scaler ? &scaler : nullptr, kLr, clip, kAccum);
    ASSERT_FALSE(o.skipped || o.non_finite);
    EXPECT_NEAR(o.grad_norm, norm, 1e-12 * norm);

    const double factor = clip / (norm + 1e-6);  // clip_factor's definition
    const float* w = gpt.weights().data<float>();
    double moved_sq = 0;
    int64_t bad = 0, first_bad = -1;
    for (int64_t i = 0; i < n; ++i) {
      const double want = w0[i] - kLr * mean[i] * factor;
      // The step's own rounding, and one rounding of the weight it lands on.
      const double tol =
          1e-5 * std::abs(kLr * mean[i] * factor) + 0x1p-23 * std::abs(w0[i]) + 1e-12;
      if (!(std::abs(w[i] - want) <= tol) && bad++ == 0) first_bad = i;
      const double step = (double(w[i]) - w0[i]) / kLr;
      moved_sq += step * step;
    }
    EXPECT_EQ(bad, 0) << "first at " << first_bad;
    // The update's norm is the clip (up to float rounding of the weights).
    EXPECT_NEAR(std::sqrt(moved_sq), clip, 1e-3 * clip);
    if (with_scaler) {
      EXPECT_EQ(working_mismatches(gpt), 0);
    }
  }
}

}  // namespace
}  // namespace memfit
