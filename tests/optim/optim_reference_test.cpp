// The optimizers with less state against PyTorch: tests/reference/make_optim_fixture.py ran
// three steps on a tiny GPT-2 layout's parameters (decay on 2-D weights, grad_scale applied to
// the gradients) for AdamW with bf16 moments (torch.optim.AdamW, each moment rounded to bf16 after
// every step) and for adamw4bit (the paper's algorithm in float32 torch operations that mirror
// memfit's kernel). Parameters to 1e-5 relative; bf16 moments within a bf16 ulp, nearly all
// equal; the 4-bit codes bit for bit (on a target with fused multiply-adds) and their scales
// exactly.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "memfit/core/dtype.h"
#include "memfit/io/checkpoint/safetensors.h"
#include "memfit/kernels/cpu/quant4.h"
#include "memfit/kernels/cpu/simd.h"
#include "memfit/optim/optimizer.h"
#include "memfit/optim/quantized_state.h"
#include "optim_test_util.h"

namespace memfit {
namespace {

const char* kFixture = MEMFIT_SOURCE_DIR "/tests/reference/optim_fixture.safetensors";

class OptimReference : public ::testing::Test {
 protected:
  OptimReference() : file(kFixture) {
    config.n_layer = int(meta("n_layer"));
    config.n_head = int(meta("n_head"));
    config.d_model = int(meta("d_model"));
    config.max_seq_len = int(meta("max_seq_len"));
    config.vocab_size = int(meta("vocab_size"));
    config.finalize();
    optim.beta1 = float(meta("beta1"));
    optim.beta2 = float(meta("beta2"));
    optim.eps = float(meta("eps"));
    optim.weight_decay = float(meta("weight_decay"));
    optim.n_head = config.n_head;
    lr = float(meta("lr"));
    grad_scale = float(meta("grad_scale"));
    steps = int(meta("steps"));
  }
  double meta(const char* key) const { return std::stod(file.metadata().at(key)); }
  Tensor load(const std::string& name, Shape shape, DType dtype = DType::f32) {
    Tensor t = Tensor::empty(pool, shape, dtype, Category::staging, name);
    file.read(name, t);
    return t;
  }
  // A slab laid out by `layout` from the fixture's "<prefix><name>" tensors (padding zero).
  Tensor slab(const ParamLayout& layout, const std::string& prefix) {
    Tensor s = Tensor::empty(pool, {layout.total()}, DType::f32, Category::staging, prefix);
    for (const ParamInfo& p : layout.params()) file.read(prefix + p.name, layout.view(s, p));
    return s;
  }
  // Runs the fixture's steps with `oc`, returning the optimizer and leaving the weights in
  // `params`.
  std::unique_ptr<Optimizer> run(const ParamLayout& layout, const OptimConfig& oc,
                                 Tensor& params) {
    params = slab(layout, "param.");
    auto opt = make_optimizer(oc, layout, pool);
    for (int t = 1; t <= steps; ++t) {
      Tensor g = slab(layout, fmt::format("grad{}.", t));
      opt->step(params, g, lr, grad_scale);
    }
    return opt;
  }
  // The weights against the fixture's, parameter by parameter, to 1e-5 relative.
  void expect_weights(const ParamLayout& layout, const Tensor& params, const std::string& prefix) {
    for (const ParamInfo& p : layout.params()) {
      Tensor want = load(prefix + p.name, p.shape);
      const float* got = params.data<float>() + p.offset;
      double diff = 0, norm = 0;
      for (int64_t k = 0; k < p.numel; ++k) {
        diff += std::pow(double(got[k]) - want.data<float>()[k], 2);
        norm += std::pow(double(want.data<float>()[k]), 2);
      }
      EXPECT_LT(std::sqrt(diff / norm), 1e-5) << p.name;
    }
  }
  Tensor state(const Optimizer& opt, const std::string& name) const {
    for (auto& [n, t] : opt.state())
      if (n == name) return t;
    ADD_FAILURE() << "no state " << name;
    return {};
  }

  io::SafetensorsReader file;
  MemoryPool pool;
  ModelConfig config;
  OptimConfig optim;
  float lr = 0, grad_scale = 1;
  int steps = 0;
};

TEST_F(OptimReference, AdamWWithBf16MomentsMatchesPyTorch) {
  const ParamLayout layout(config);
  OptimConfig oc = optim;
  oc.state_dtype = DType::bf16;
  Tensor params;
  auto opt = run(layout, oc, params);
  expect_weights(layout, params, "bf16.after.");
  int64_t differ = 0, total = 0;
  for (const char* moment : {"m", "v"}) {
    const auto* bits = static_cast<const uint16_t*>(state(*opt, moment).raw_data());
    for (const ParamInfo& p : layout.params()) {
      Tensor want = load(fmt::format("bf16.{}.{}", moment, p.name), p.shape);
      for (int64_t k = 0; k < p.numel; ++k) {
        const float got = f32_from_bf16(bits[p.offset + k]), w = want.data<float>()[k];
        ++total;
        if (got == w) continue;
        ++differ;  // torch's m b1 + (1-b1) g and memfit's lerp meet a rounding midpoint
        ASSERT_LE(std::fabs(got - w), std::fabs(w) * 0x1p-7) << moment << " " << p.name << k;
      }
    }
  }
  EXPECT_LE(differ, total / 200) << "bf16 moments that differ by an ulp";
}

TEST_F(OptimReference, AdamW4bitMatchesPyTorch) {
  const ParamLayout layout(config);
  OptimConfig oc = optim;
  oc.name = "adamw4bit";
  Tensor params;
  auto opt = run(layout, oc, params);
  expect_weights(layout, params, "4bit.after.");

  // The maps are the reference's, value for value.
  Tensor smap = load("signed_map", {16}), umap = load("unsigned_map", {16});
  for (int k = 0; k < 16; ++k) {
    EXPECT_EQ(kernels::signed_de4_map().values[k], smap.data<float>()[k]) << k;
    EXPECT_EQ(kernels::unsigned_linear4_map().values[k], umap.data<float>()[k]) << k;
  }
  const QuantizedStateLayout ml(layout, {128, 4, false}), vl(layout, {128, 4, true});
  const Tensor mq = state(*opt, "m.codes"), ma = state(*opt, "m.absmax");
  const Tensor vq = state(*opt, "v.codes"), vr = state(*opt, "v.rowcol");
  const Tensor mf = state(*opt, "m.f32"), vf = state(*opt, "v.f32");
  const std::string target(kernels::simd_target());
  const bool fused = target != "SCALAR" && target != "EMU128";
  int quantized = 0;
  for (size_t i = 0; i < layout.params().size(); ++i) {
    const ParamInfo& p = layout.params()[i];
    SCOPED_TRACE(p.name);
    const auto& ms = ml.slot(i);
    const auto& vs = vl.slot(i);
    if (!ms.quantized) {  // FP32 moments: the tails' scalar arithmetic (and every value on the
                          // scalar target) may round differently; m = b1 m + (1 - b1) g cancels,
                          // so its error is the rounding of its operands (~0.1: 1e-8).
      Tensor wm = load("4bit.m." + p.name, {p.numel}), wv = load("4bit.v." + p.name, {p.numel});
      for (int64_t k = 0; k < p.numel; ++k) {
        EXPECT_NEAR(mf.data<float>()[ms.offset + k], wm.data<float>()[k],
                    1e-6 * std::fabs(wm.data<float>()[k]) + 1e-8);
        EXPECT_NEAR(vf.data<float>()[vs.offset + k], wv.data<float>()[k],
                    1e-6 * std::fabs(wv.data<float>()[k]) + 1e-14);
      }
      continue;
    }
    ++quantized;
    ASSERT_TRUE(vs.rank1);  // every quantised tensor here is a matrix
    Tensor wmq = load("4bit.m_codes." + p.name, {p.numel}, DType::u8);
    Tensor wvq = load("4bit.v_codes." + p.name, {p.numel}, DType::u8);
    Tensor wma = load("4bit.m_absmax." + p.name, {kernels::quant4_blocks(p.numel)});
    Tensor wrows = load("4bit.v_rows." + p.name, {p.shape[0]});
    Tensor wcols = load("4bit.v_cols." + p.name, {p.shape[1]});
    const auto* mcodes = reinterpret_cast<const uint8_t*>(mq.data<int8_t>()) + ms.offset * 64;
    const auto* vcodes = reinterpret_cast<const uint8_t*>(vq.data<int8_t>()) + vs.offset * 64;
    int64_t differ = 0;
    for (int64_t k = 0; k < p.numel; ++k) {
      differ += kernels::code4_at(mcodes, k) != wmq.data<uint8_t>()[k];
      differ += kernels::code4_at(vcodes, k) != wvq.data<uint8_t>()[k];
    }
    if (fused) {
      EXPECT_EQ(differ, 0) << "codes that differ from the reference's";
      for (int64_t b = 0; b < kernels::quant4_blocks(p.numel); ++b)
        EXPECT_EQ(ma.data<float>()[ms.scale + b], wma.data<float>()[b]) << b;
      for (int64_t r = 0; r < p.shape[0]; ++r)
        EXPECT_EQ(vr.data<float>()[vs.scale + r], wrows.data<float>()[r]) << r;
      for (int64_t c = 0; c < p.shape[1]; ++c)
        EXPECT_EQ(vr.data<float>()[vs.scale + p.shape[0] + c], wcols.data<float>()[c]) << c;
    } else {
      EXPECT_LE(differ, p.numel / 100) << "codes that differ from the reference's";
    }
  }
  EXPECT_EQ(quantized, 3);  // wte, mlp.c_fc, mlp.c_proj
}

}  // namespace
}  // namespace memfit
