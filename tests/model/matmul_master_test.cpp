// The widened route's matmuls reading the f32 master weights in place (ActivationOptions::
// matmul_master, Note [Matmuls read the master weights]): with the working copy's matmul
// weights overwritten by NaN, a model that reads the master computes the same loss bit for bit
// and one that does not computes NaN, for GPT-2 (tied head: the embedding lookup still reads the
// working copy) and LLaMA (untied head); its blocks' scratch holds no weight; and a model
// without whole master weights, or whose matmuls do not widen, refuses the option. fp16 widens
// on every CPU; bf16 where oneDNN has no bf16 matmul (the AVX2 cap of CI's second run).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "gpt2_test_util.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/model/block_step.h"
#include "memfit/model/step_plan.h"
#include "memfit/model/transformer.h"
#include "memfit/kernels/cpu/convert.h"

namespace memfit {
namespace {

using namespace gpt2_test;

constexpr int kB = 2, kT = 13;

ActivationOptions options(bool matmul_master, Precision precision = Precision::fp16) {
  ActivationOptions o;
  o.lm_head_chunk = 5;  // several chunks, the last one short
  o.matmul_master = matmul_master;
  o.precision = precision;
  if (precision == Precision::fp16) o.attention = AttentionKind::plain;  // no fp16 flash
  return o;
}

bool is_matmul_weight(ParamRole r) {
  switch (r) {
    case ParamRole::attn_qkv_weight:
    case ParamRole::attn_q_weight:
    case ParamRole::attn_k_weight:
    case ParamRole::attn_v_weight:
    case ParamRole::attn_proj_weight:
    case ParamRole::mlp_fc_weight:
    case ParamRole::mlp_gate_weight:
    case ParamRole::mlp_up_weight:
    case ParamRole::mlp_proj_weight:
    case ParamRole::lm_head: return true;
    default: return false;
  }
}

std::vector<Precision> widened_precisions() {
  std::vector<Precision> p{Precision::fp16};
  if (kernels::matmul_widens(DType::bf16)) p.push_back(Precision::bf16);
  return p;
}

TEST(MatmulMaster, TheMatmulsReadTheMasterWeightsAndTheRestTheWorkingCopy) {
  for (Family family : {Family::gpt2, Family::llama}) {
    for (Precision precision : widened_precisions()) {
      SCOPED_TRACE(fmt::format("{} {}", family_name(family), precision_name(precision)));
      const ModelConfig c = three_layers(family);
      MemoryPool pool;
      Transformer gpt(c, pool, {precision, true});
      gpt.init_weights(3);
      Batch batch(pool, kB, kT, c.vocab_size, 1);
      gpt.reserve(kB, kT, options(true, precision));
      const float before = gpt.forward(batch.tokens, batch.targets, /*training=*/true);
      gpt.backward();
      ASSERT_TRUE(std::isfinite(before));

      // NaN in every matmul weight of the working copy (the tied head is the embedding, which
      // the lookup reads from the working copy: it stays).
      const float nan = std::numeric_limits<float>::quiet_NaN();
      for (const ParamInfo& p : gpt.layout().params()) {
        if (!is_matmul_weight(p.role)) continue;
        Tensor w = gpt.param(p.name);
        Tensor nans = Tensor::empty(pool, w.shape(), DType::f32, Category::staging, "nans");
        for (int64_t i = 0; i < nans.numel(); ++i) nans.data<float>()[i] = nan;
        kernels::convert(w, nans);
      }
      const float after = gpt.forward(batch.tokens, batch.targets, true);
      gpt.backward();
      EXPECT_EQ(std::memcmp(&before, &after, 4), 0) << before << " then " << after;
      for (int64_t i = 0; i < gpt.grads().numel(); ++i)
        ASSERT_TRUE(std::isfinite(gpt.grads().data<float>()[i])) << "gradient element " << i;

      gpt.reserve(kB, kT, options(false, precision));  // the same model widening its working copy
      EXPECT_TRUE(std::isnan(gpt.forward(batch.tokens, batch.targets, false)));
    }
  }
}

TEST(MatmulMaster, TheScratchHoldsNoWeight) {
  for (Family family : {Family::gpt2, Family::llama}) {
    SCOPED_TRACE(family_name(family));
    const ModelConfig c = three_layers(family);
    const int64_t rows = int64_t{kB} * kT;
    ActivationOptions o = options(true);
    const StepPlan reading = plan_step(c, kB, kT, o);
    o.matmul_master = false;
    const StepPlan widening = plan_step(c, kB, kT, o);
    auto bytes = [](const StepPlan& p, const std::string& tag) -> size_t {
      for (const BufferSpec& b : p.buffers)
        if (b.tag == tag) return b.bytes();
      ADD_FAILURE() << "no " << tag << " in the plan";
      return 0;
    };
    // The blocks' scratch: the largest layer's activations alone, less than with its weight.
    EXPECT_EQ(bytes(reading, "ws.widen"), widen_scratch_bytes(c, rows, DType::f16, true));
    EXPECT_LT(bytes(reading, "ws.widen"), bytes(widening, "ws.widen"));
    // The head's: the chunk's widened rows, no block of the weight.
    EXPECT_EQ(bytes(reading, "ws.widen.head"),
              MemoryPool::round_up(size_t{5} * static_cast<size_t>(c.d_model) * 4));
    EXPECT_LT(bytes(reading, "ws.widen.head"), bytes(widening, "ws.widen.head"));
  }
}

TEST(MatmulMaster, AModelWithoutWholeMasterWeightsOrWideningMatmulsRefusesIt) {
  const ModelConfig c = three_layers();
  MemoryPool pool;
  Transformer fp32(c, pool, {Precision::fp32, true});
  EXPECT_THROW(fp32.reserve(kB, kT, options(true, Precision::fp32)), Error);
  Transformer pure(c, pool, {Precision::bf16, false});
  EXPECT_THROW(pure.reserve(kB, kT, options(true, Precision::bf16)), Error);
  try {
    pure.reserve(kB, kT, options(true, Precision::bf16));
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("master weights"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace memfit
