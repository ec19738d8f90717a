// bf16 gradients (--grad-dtype bf16, Note [Gradients in bf16] in docs/notes/zero.md): every
// optimizer steps from bf16 gradients widened a chunk at a time into one f32 buffer, and the
// result is, bit for bit, its step from those values given in f32. The embeddings of a 50,257
// vocabulary (6.4M elements) are several chunks of kGradWidenChunk, so the cuts inside a
// parameter (on 8-bit blocks, on Adam-mini's blocks) are exercised; a range (a ZeRO shard) needs
// no larger buffer than the whole layout.
#include <gtest/gtest.h>

#include <cstring>
#include <string>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/optim/optimizer.h"
#include "memfit/state/shard.h"
#include "optim_test_util.h"

namespace memfit {
namespace {

using testing::Slabs;

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(Bf16Grads, EveryOptimizerStepsFromWidenedChunksAsFromF32) {
  ModelConfig mc = ModelConfig::preset("gpt2-tiny");
  mc.vocab_size = 50257;
  mc.n_layer = 1;
  mc.finalize();
  for (const char* name :
       {"adamw", "adamw8bit", "lion", "lion8bit", "adam-mini", "sgd", "adamw4bit"}) {
    for (bool master : {false, true}) {
      if (master && std::string(name) != "adamw") continue;  // step_master: AdamW's fused pass
      OptimConfig oc;
      oc.name = name;
      oc.n_head = mc.n_head;
      oc.seed = 7;
      Slabs a(mc), b(mc);
      a.fill_grads(3);
      const int64_t n = a.layout.total();
      Tensor g16 = Tensor::empty(b.pool, {n}, DType::bf16, Category::grads, "grads.bf16");
      kernels::convert(g16, a.grads);
      kernels::convert(a.grads, g16);  // the reference: the bf16 values, in f32
      auto oa = make_optimizer(oc, a.layout, a.pool);
      auto ob = make_optimizer(oc, b.layout, b.pool);
      const int64_t widen = grad_widen_elements(*ob);
      EXPECT_GT(widen, 0);
      if (std::string(name) == "adamw4bit") {  // rank-1 state: a matrix is one chunk
        EXPECT_EQ(widen, a.layout.find("wte.weight").numel) << name;
      } else {
        EXPECT_LT(widen, n / 2) << name << ": the embeddings are cut into chunks";
      }
      EXPECT_EQ(widen, grad_widen_elements(oc, b.layout));
      ob->set_grad_widen(Tensor::empty(b.pool, {widen}, DType::f32, Category::staging, "widen"));
      Tensor wa = Tensor::empty(a.pool, {n}, DType::bf16, Category::params, "working");
      Tensor wb = Tensor::empty(b.pool, {n}, DType::bf16, Category::params, "working");
      for (int t = 0; t < 2; ++t) {
        if (master) {
          oa->step_master(a.params, wa, a.grads, 1e-2f, 0.5f);
          ob->step_master(b.params, wb, g16, 1e-2f, 0.5f);
        } else {
          oa->step(a.params, a.grads, 1e-2f, 0.5f);
          ob->step(b.params, g16, 1e-2f, 0.5f);
        }
      }
      EXPECT_TRUE(same_bytes(a.params, b.params)) << name << (master ? " (master)" : "");
      if (master) { EXPECT_TRUE(same_bytes(wa, wb)) << name; }
      const auto sa = oa->state(), sb = ob->state();
      ASSERT_EQ(sa.size(), sb.size());
      for (size_t i = 0; i < sa.size(); ++i)
        EXPECT_TRUE(same_bytes(sa[i].second, sb[i].second)) << name << " " << sa[i].first;
    }
  }
}

TEST(Bf16Grads, WithoutAWideningBufferTheStepIsRefused) {
  ModelConfig mc = ModelConfig::preset("gpt2-tiny");
  mc.finalize();
  Slabs s(mc);
  OptimConfig oc;
  oc.name = "adamw";
  auto opt = make_optimizer(oc, s.layout, s.pool);
  Tensor g16 = Tensor::empty(s.pool, {s.layout.total()}, DType::bf16, Category::grads, "g");
  g16.zero();
  EXPECT_THROW(opt->step(s.params, g16, 1e-3f, 1.0f), Error);
}

}  // namespace
}  // namespace memfit
