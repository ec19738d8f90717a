// 8-bit Lion over a whole layout against double-precision Lion: two steps, each from the
// optimizer's own state; parameters tight, quantised momentum within the signed map's bound,
// small tensors' FP32 momentum tight.
#include "memfit/optim/lion8bit.h"

#include <gtest/gtest.h>

#include "memfit/kernels/cpu/blockwise_quant.h"
#include "optim_test_util.h"

namespace memfit {
namespace {

TEST(Lion8bit, TwoStepsMatchDoubleReference) {
  testing::Slabs s(testing::odd_config());
  OptimConfig c;
  c.beta2 = 0.99f;
  c.weight_decay = 0.5f;
  Lion8bit opt(c, s.layout, s.pool);
  QuantizedStateLayout ql(s.layout);
  auto st = opt.state();  // m.codes, m.absmax, m.f32
  ASSERT_EQ(st.size(), 3u);
  const Tensor &mq = st[0].second, &ma = st[1].second, &mf = st[2].second;
  const auto& map = kernels::signed_dynamic_map();
  const float lr = 1e-3f;
  for (int t = 1; t <= 2; ++t) {
    s.fill_grads(300 + t);
    std::vector<double> p = s.params_copy();
    std::vector<std::vector<double>> refs;  // each tensor's momentum after the step
    for (size_t i = 0; i < s.layout.params().size(); ++i) {
      const ParamInfo& pi = s.layout.params()[i];
      const auto& slot = ql.slot(i);
      const int64_t code = slot.offset * kernels::kQuantBlock;
      std::vector<double> m =
          slot.quantized ? testing::dequantize_ref(mq.data<int8_t>() + code,
                                                   ma.data<float>() + slot.offset, pi.numel, map)
                         : std::vector<double>(mf.data<float>() + slot.offset,
                                               mf.data<float>() + slot.offset + pi.numel);
      testing::LionRef r{lr, c.beta1, c.beta2, pi.decay ? c.weight_decay : 0.0};
      for (int64_t k = 0; k < pi.numel; ++k)
        testing::lion_ref(p[pi.offset + k], s.grads.data<float>()[pi.offset + k], m[k], r);
      refs.push_back(std::move(m));
    }
    opt.step(s.params, s.grads, lr, 1.0f);
    SCOPED_TRACE("step " + std::to_string(t));
    testing::expect_all_close(s.params.data<float>(), p.data(), s.layout.total(), 1e-6, 1e-6,
                              "params");
    for (size_t i = 0; i < s.layout.params().size(); ++i) {
      const ParamInfo& pi = s.layout.params()[i];
      const auto& slot = ql.slot(i);
      SCOPED_TRACE(pi.name);
      if (!slot.quantized) {
        testing::expect_all_close(mf.data<float>() + slot.offset, refs[i].data(), pi.numel, 1e-8,
                                  1e-5, "m");
        continue;
      }
      auto md = testing::dequantize_ref(mq.data<int8_t>() + slot.offset * kernels::kQuantBlock,
                                        ma.data<float>() + slot.offset, pi.numel, map);
      const double bound = testing::max_half_gap(map) + 1e-6;
      for (int64_t k = 0; k < pi.numel; ++k)
        ASSERT_LE(std::fabs(md[k] - refs[i][k]), bound * ma.data<float>()[slot.offset + k / 256])
            << k;
    }
  }
}

}  // namespace
}  // namespace memfit
