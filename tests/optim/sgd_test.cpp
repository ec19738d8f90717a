// Plain SGD over a whole layout: p - lr (scale g + wd p) on decay tensors, p - lr scale g on the
// rest; no state.
#include "memfit/optim/sgd.h"

#include <gtest/gtest.h>

#include "optim_test_util.h"

namespace memfit {
namespace {

TEST(Sgd, StepMatchesFormulaWithDecayOnDecayTensorsOnly) {
  testing::Slabs s(testing::odd_config());
  OptimConfig c;
  c.weight_decay = 0.5f;
  Sgd opt(c, s.layout, s.pool);
  s.fill_grads(7);
  std::vector<double> p = s.params_copy();
  for (const ParamInfo& pi : s.layout.params())
    for (int64_t k = pi.offset; k < pi.offset + pi.numel; ++k)
      p[k] -= 0.1 * (2.0 * s.grads.data<float>()[k] + (pi.decay ? 0.5 * p[k] : 0.0));
  opt.step(s.params, s.grads, 0.1f, 2.0f);
  testing::expect_all_close(s.params.data<float>(), p.data(), s.layout.total(), 1e-6, 1e-6,
                            "params");
  EXPECT_TRUE(opt.state().empty());
  EXPECT_EQ(opt.state_bytes(), 0u);
}

}  // namespace
}  // namespace memfit
