// 8-bit AdamW kernel against a double-precision AdamW: the parameter update is tight (it uses the
// FP32 moments before requantisation), the stored moments are within the maps' rounding bound,
// over sizes with partial blocks and partial vectors.
#include "memfit/kernels/cpu/adamw8bit.h"

#include <gtest/gtest.h>

#include "memfit/kernels/cpu/blockwise_quant.h"
#include "optimizer_reference.h"

namespace memfit::kernels {
namespace {

using memfit::testing::AdamRef;

struct Buffers {
  MemoryPool pool;
  Tensor p, g, mq, ma, vq, va;
  explicit Buffers(int64_t n) {
    p = Tensor::empty(pool, {n}, DType::f32, Category::params, "p");
    g = Tensor::empty(pool, {n}, DType::f32, Category::grads, "g");
    mq = Tensor::empty(pool, {n}, DType::i8, Category::optimizer, "mq");
    vq = Tensor::empty(pool, {n}, DType::i8, Category::optimizer, "vq");
    ma = Tensor::empty(pool, {quant_blocks(n)}, DType::f32, Category::optimizer, "ma");
    va = Tensor::empty(pool, {quant_blocks(n)}, DType::f32, Category::optimizer, "va");
  }
};

void fill(Tensor& t, uint32_t seed, float stddev) {
  auto v = memfit::testing::normal_vector(t.numel(), seed, stddev);
  std::copy(v.begin(), v.end(), t.data<float>());
}

// Checks the stored moments against reference values within the rounding bound per block.
void expect_state_within_bound(const Tensor& q, const Tensor& absmax,
                               const std::vector<double>& ref, const QuantMap& map,
                               const char* what) {
  const int64_t n = q.numel();
  auto deq = memfit::testing::dequantize_ref(q.data<int8_t>(), absmax.data<float>(), n, map);
  const double bound = memfit::testing::max_half_gap(map);
  int64_t bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    double a = absmax.data<float>()[i / kQuantBlock];
    if (!(std::fabs(deq[i] - ref[i]) <= (bound + 1e-6) * a) && bad++ < 5)
      ADD_FAILURE() << what << "[" << i << "] = " << deq[i] << ", expected " << ref[i] << " within "
                    << bound << " x absmax " << a;
  }
  EXPECT_EQ(bad, 0) << what;
}

TEST(AdamW8bitKernel, TwoStepsMatchDoubleReference) {
  const AdamWHyper h{1e-2f, 0.9f, 0.95f, 1e-8f, 0.1f};
  const AdamRef r{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
  const float scale = 0.5f;
  for (int64_t n : {16, 100, 256, 256 * 5 + 37, 256 * 300 + 37}) {
    Buffers b(n);
    fill(b.p, 1, 1.0f);
    std::vector<double> p(b.p.data<float>(), b.p.data<float>() + n), m(n, 0.0), v(n, 0.0);
    for (int64_t t = 1; t <= 2; ++t) {
      fill(b.g, 10 + static_cast<uint32_t>(t), 1.0f);
      // The reference starts from the kernel's stored state (dequantised in double), so each
      // step is checked on its own: p tight, the new state within the rounding bound.
      if (t > 1) {
        m = memfit::testing::dequantize_ref(b.mq.data<int8_t>(), b.ma.data<float>(), n,
                                            signed_dynamic_map());
        v = memfit::testing::dequantize_ref(b.vq.data<int8_t>(), b.va.data<float>(), n,
                                            unsigned_dynamic_map());
        for (int64_t i = 0; i < n; ++i) p[i] = b.p.data<float>()[i];
      }
      for (int64_t i = 0; i < n; ++i)
        memfit::testing::adamw_ref(p[i], scale * b.g.data<float>()[i], m[i], v[i], r, t);
      adamw8bit_update(b.p, b.g, b.mq, b.ma, b.vq, b.va, h, t, scale);
      SCOPED_TRACE("n = " + std::to_string(n) + ", t = " + std::to_string(t));
      memfit::testing::expect_all_close(b.p.data<float>(), p.data(), n, 2e-6, 1e-6, "p");
      expect_state_within_bound(b.mq, b.ma, m, signed_dynamic_map(), "m");
      expect_state_within_bound(b.vq, b.va, v, unsigned_dynamic_map(), "v");
    }
  }
}

TEST(AdamW8bitKernel, Fp32StateMatchesDoubleReference) {
  const AdamWHyper h{1e-2f, 0.9f, 0.999f, 1e-8f, 0.0f};
  const AdamRef r{h.lr, h.beta1, h.beta2, h.eps, h.weight_decay};
  const int64_t n = 70001;  // over the threading threshold
  MemoryPool pool;
  Tensor p = Tensor::empty(pool, {n}, DType::f32, Category::params, "p");
  Tensor g = Tensor::empty(pool, {n}, DType::f32, Category::grads, "g");
  Tensor m = Tensor::empty(pool, {n}, DType::f32, Category::optimizer, "m");
  Tensor v = Tensor::empty(pool, {n}, DType::f32, Category::optimizer, "v");
  fill(p, 3, 1.0f);
  std::vector<double> pr(p.data<float>(), p.data<float>() + n), mr(n, 0.0), vr(n, 0.0);
  for (int64_t t = 1; t <= 3; ++t) {
    fill(g, 20 + static_cast<uint32_t>(t), 0.1f);
    for (int64_t i = 0; i < n; ++i)
      memfit::testing::adamw_ref(pr[i], g.data<float>()[i], mr[i], vr[i], r, t);
    adamw8bit_update_f32(p, g, m, v, h, t);
  }
  memfit::testing::expect_all_close(p.data<float>(), pr.data(), n, 2e-6, 1e-6, "p");
  memfit::testing::expect_all_close(m.data<float>(), mr.data(), n, 1e-7, 1e-5, "m");
  memfit::testing::expect_all_close(v.data<float>(), vr.data(), n, 1e-9, 1e-5, "v");
}

TEST(AdamW8bitKernel, ArgumentsAreChecked) {
  Buffers b(300);
  const AdamWHyper h;
  Tensor short_codes = b.mq.view(0, {299});
  EXPECT_THROW(adamw8bit_update(b.p, b.g, short_codes, b.ma, b.vq, b.va, h, 1), ShapeError);
  EXPECT_THROW(adamw8bit_update(b.p, b.g, b.mq, b.ma, b.vq, b.va, h, 0), Error);
  EXPECT_THROW(adamw8bit_update(b.p, b.g, b.ma, b.mq, b.vq, b.va, h, 1), DTypeError);
}

}  // namespace
}  // namespace memfit::kernels
