// Lion and 8-bit Lion kernels against a double-precision Lion: FP32 Lion tight over several
// steps; 8-bit Lion tight on the parameter (its update uses the FP32 momentum) and within the
// signed map's rounding bound on the stored momentum.
#include "memfit/kernels/cpu/lion.h"

#include <gtest/gtest.h>

#include "memfit/kernels/cpu/blockwise_quant.h"
#include "optimizer_reference.h"

namespace memfit::kernels {
namespace {

using memfit::testing::LionRef;

void fill(Tensor& t, uint32_t seed, float stddev) {
  auto v = memfit::testing::normal_vector(t.numel(), seed, stddev);
  std::copy(v.begin(), v.end(), t.data<float>());
}

TEST(LionKernel, StepsMatchDoubleReference) {
  const LionHyper h{1e-3f, 0.9f, 0.99f, 0.5f};
  const LionRef r{h.lr, h.beta1, h.beta2, h.weight_decay};
  for (int64_t n : {1, 17, 4096 + 5, 17 * 4096 + 3}) {
    MemoryPool pool;
    Tensor p = Tensor::empty(pool, {n}, DType::f32, Category::params, "p");
    Tensor g = Tensor::empty(pool, {n}, DType::f32, Category::grads, "g");
    Tensor m = Tensor::empty(pool, {n}, DType::f32, Category::optimizer, "m");
    fill(p, 1, 1.0f);
    std::vector<double> pr(p.data<float>(), p.data<float>() + n), mr(n, 0.0);
    for (int t = 1; t <= 3; ++t) {
      fill(g, 30 + t, 1.0f);
      for (int64_t i = 0; i < n; ++i)
        memfit::testing::lion_ref(pr[i], 2.0 * g.data<float>()[i], mr[i], r);
      lion_update(p, g, m, h, 2.0f);
    }
    SCOPED_TRACE("n = " + std::to_string(n));
    memfit::testing::expect_all_close(p.data<float>(), pr.data(), n, 1e-6, 1e-6, "p");
    memfit::testing::expect_all_close(m.data<float>(), mr.data(), n, 1e-7, 1e-5, "m");
  }
}

TEST(LionKernel, ZeroGradientAndMomentumOnlyDecay) {
  MemoryPool pool;
  Tensor p = Tensor::empty(pool, {40}, DType::f32, Category::params, "p");
  Tensor g = Tensor::empty(pool, {40}, DType::f32, Category::grads, "g");
  Tensor m = Tensor::empty(pool, {40}, DType::f32, Category::optimizer, "m");
  for (int i = 0; i < 40; ++i) p.data<float>()[i] = 1.0f;
  lion_update(p, g, m, {0.1f, 0.9f, 0.99f, 0.5f});
  for (int i = 0; i < 40; ++i) EXPECT_FLOAT_EQ(p.data<float>()[i], 0.95f);  // sign(0) = 0
}

TEST(Lion8bitKernel, TwoStepsMatchDoubleReference) {
  const LionHyper h{1e-3f, 0.9f, 0.99f, 0.1f};
  const LionRef r{h.lr, h.beta1, h.beta2, h.weight_decay};
  const QuantMap& map = signed_dynamic_map();
  for (int64_t n : {16, 255, 256 * 6 + 9, 256 * 300 + 9}) {
    MemoryPool pool;
    Tensor p = Tensor::empty(pool, {n}, DType::f32, Category::params, "p");
    Tensor g = Tensor::empty(pool, {n}, DType::f32, Category::grads, "g");
    Tensor mq = Tensor::empty(pool, {n}, DType::i8, Category::optimizer, "mq");
    Tensor ma = Tensor::empty(pool, {quant_blocks(n)}, DType::f32, Category::optimizer, "ma");
    fill(p, 2, 1.0f);
    std::vector<double> pr(n), mr(n, 0.0);
    for (int t = 1; t <= 2; ++t) {
      fill(g, 40 + t, 1.0f);
      if (t > 1) mr = memfit::testing::dequantize_ref(mq.data<int8_t>(), ma.data<float>(), n, map);
      for (int64_t i = 0; i < n; ++i) pr[i] = p.data<float>()[i];
      for (int64_t i = 0; i < n; ++i)
        memfit::testing::lion_ref(pr[i], g.data<float>()[i], mr[i], r);
      lion8bit_update(p, g, mq, ma, h);
      SCOPED_TRACE("n = " + std::to_string(n) + ", t = " + std::to_string(t));
      memfit::testing::expect_all_close(p.data<float>(), pr.data(), n, 1e-6, 1e-6, "p");
      auto deq = memfit::testing::dequantize_ref(mq.data<int8_t>(), ma.data<float>(), n, map);
      const double bound = memfit::testing::max_half_gap(map) + 1e-6;
      for (int64_t i = 0; i < n; ++i)
        ASSERT_LE(std::fabs(deq[i] - mr[i]), bound * ma.data<float>()[i / kQuantBlock]) << i;
    }
  }
}

}  // namespace
}  // namespace memfit::kernels
