// FP32 Lion over a whole layout against double-precision Lion: three steps, decay only on decay
// tensors, gradient scale applied.
#include "memfit/optim/lion.h"

#include <gtest/gtest.h>

#include "optim_test_util.h"

namespace memfit {
namespace {

TEST(Lion, StepsMatchDoubleReference) {
  testing::Slabs s(testing::odd_config());
  OptimConfig c;
  c.beta1 = 0.9f;
  c.beta2 = 0.99f;
  c.weight_decay = 1.0f;
  Lion opt(c, s.layout, s.pool);
  std::vector<double> p = s.params_copy(), m(s.layout.total(), 0.0);
  const float lr = 1e-3f, scale = 2.0f;
  for (int t = 1; t <= 3; ++t) {
    s.fill_grads(200 + t);
    for (const ParamInfo& pi : s.layout.params()) {
      testing::LionRef r{lr, c.beta1, c.beta2, pi.decay ? c.weight_decay : 0.0};
      for (int64_t k = pi.offset; k < pi.offset + pi.numel; ++k)
        testing::lion_ref(p[k], scale * s.grads.data<float>()[k], m[k], r);
    }
    opt.step(s.params, s.grads, lr, scale);
  }
  testing::expect_all_close(s.params.data<float>(), p.data(), s.layout.total(), 1e-6, 1e-6,
                            "params");
  testing::expect_all_close(opt.state()[0].second.data<float>(), m.data(), s.layout.total(), 1e-8,
                            1e-5, "m");
}

TEST(Lion, StateIsFourBytesPerParameter) {
  ParamLayout layout(ModelConfig::preset("gpt2-tiny"));
  EXPECT_EQ(Lion::state_bytes_for(layout), static_cast<size_t>(layout.total()) * 4);
}

}  // namespace
}  // namespace memfit
