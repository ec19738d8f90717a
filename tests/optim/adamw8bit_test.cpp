// 8-bit AdamW over a whole layout against double-precision AdamW: two steps, each from the
// optimizer's own (dequantised) state; decay only on decay tensors; small tensors on FP32 state.
#include "memfit/optim/adamw8bit.h"

#include <gtest/gtest.h>

#include "memfit/kernels/cpu/blockwise_quant.h"
#include "optim_test_util.h"

namespace memfit {
namespace {

TEST(AdamW8bit, TwoStepsMatchDoubleReference) {
  testing::Slabs s(testing::odd_config());
  OptimConfig c;
  c.weight_decay = 0.1f;
  AdamW8bit opt(c, s.layout, s.pool);
  QuantizedStateLayout ql(s.layout);
  auto st = opt.state();  // m.codes, m.absmax, m.f32, v.codes, v.absmax, v.f32
  ASSERT_EQ(st.size(), 6u);
  const Tensor &mq = st[0].second, &ma = st[1].second, &mf = st[2].second;
  const Tensor &vq = st[3].second, &va = st[4].second, &vf = st[5].second;
  const auto& smap = kernels::signed_dynamic_map();
  const auto& umap = kernels::unsigned_dynamic_map();
  const float lr = 1e-2f, scale = 0.5f;

  for (int64_t t = 1; t <= 2; ++t) {
    s.fill_grads(100 + static_cast<uint32_t>(t));
    std::vector<double> p = s.params_copy();
    // The reference's moments, per tensor, from the optimizer's state before this step.
    std::vector<std::vector<double>> m, v;
    for (size_t i = 0; i < s.layout.params().size(); ++i) {
      const ParamInfo& pi = s.layout.params()[i];
      const auto& slot = ql.slot(i);
      if (slot.quantized) {
        const int64_t code = slot.offset * kernels::kQuantBlock;
        m.push_back(testing::dequantize_ref(mq.data<int8_t>() + code,
                                            ma.data<float>() + slot.offset, pi.numel, smap));
        v.push_back(testing::dequantize_ref(vq.data<int8_t>() + code,
                                            va.data<float>() + slot.offset, pi.numel, umap));
      } else {
        m.emplace_back(mf.data<float>() + slot.offset, mf.data<float>() + slot.offset + pi.numel);
        v.emplace_back(vf.data<float>() + slot.offset, vf.data<float>() + slot.offset + pi.numel);
      }
      testing::AdamRef r{lr, c.beta1, c.beta2, c.eps, pi.decay ? c.weight_decay : 0.0};
      for (int64_t k = 0; k < pi.numel; ++k)
        testing::adamw_ref(p[pi.offset + k], scale * s.grads.data<float>()[pi.offset + k], m[i][k],
                           v[i][k], r, t);
    }
    opt.step(s.params, s.grads, lr, scale);
    SCOPED_TRACE("step " + std::to_string(t));
    testing::expect_all_close(s.params.data<float>(), p.data(), s.layout.total(), 2e-6, 1e-6,
                              "params");

    // State: FP32 tensors tight, quantised ones within the maps' rounding bound.
    for (size_t i = 0; i < s.layout.params().size(); ++i) {
      const ParamInfo& pi = s.layout.params()[i];
      const auto& slot = ql.slot(i);
      SCOPED_TRACE(pi.name);
      if (!slot.quantized) {
        testing::expect_all_close(mf.data<float>() + slot.offset, m[i].data(), pi.numel, 1e-8, 1e-5,
                                  "m");
        testing::expect_all_close(vf.data<float>() + slot.offset, v[i].data(), pi.numel, 1e-10,
                                  1e-5, "v");
        continue;
      }
      const int64_t code = slot.offset * kernels::kQuantBlock;
      auto md = testing::dequantize_ref(mq.data<int8_t>() + code, ma.data<float>() + slot.offset,
                                        pi.numel, smap);
      auto vd = testing::dequantize_ref(vq.data<int8_t>() + code, va.data<float>() + slot.offset,
                                        pi.numel, umap);
      const double mb = testing::max_half_gap(smap) + 1e-6, vb = testing::max_half_gap(umap) + 1e-6;
      for (int64_t k = 0; k < pi.numel; ++k) {
        const int64_t b = slot.offset + k / kernels::kQuantBlock;
        ASSERT_LE(std::fabs(md[k] - m[i][k]), mb * ma.data<float>()[b]) << k;
        ASSERT_LE(std::fabs(vd[k] - v[i][k]), vb * va.data<float>()[b]) << k;
      }
    }
  }
}

TEST(AdamW8bit, StateIsAboutTwoBytesPerParameter) {
  ModelConfig gc = ModelConfig::preset("gpt2-small-test");
  ParamLayout layout(gc);
  QuantizedStateLayout q(layout);
  int64_t quantised = 0, small = 0;
  for (const ParamInfo& p : layout.params()) (p.numel >= 4096 ? quantised : small) += p.numel;
  // Two moments: a code byte per value (blocks padded to 256) and an absmax per block, plus
  // FP32 for the small tensors.
  const size_t bytes = AdamW8bit::state_bytes_for(layout);
  EXPECT_EQ(bytes, 2 * q.bytes());
  EXPECT_GE(bytes, static_cast<size_t>(2 * quantised + 8 * small));
  EXPECT_LT(static_cast<double>(bytes) / layout.total(), 2.05);
}

}  // namespace
}  // namespace memfit
