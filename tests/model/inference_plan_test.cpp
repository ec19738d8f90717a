// The inference plan (ActivationOptions::inference, what `memfit sample` reserves): the step is
// the evaluation forward alone, so the plan has no backward phase and no gradient buffer, its
// activations arena holds about two blocks where the training plan holds every block, and the
// model allocates no gradient slab. Its logits and evaluation loss are bit for bit the training
// plan's, for both families (GPT-2's tied head, LLaMA's untied one), fp32 and bf16, flash and
// plain attention; a training forward under it is an error; reserving for training afterwards
// brings the slab back.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gpt2_test_util.h"
#include "memfit/model/step_plan.h"
#include "memfit/model/transformer.h"

namespace memfit {
namespace {

using namespace gpt2_test;

constexpr int kB = 2, kT = 13;

ActivationOptions options(bool inference, AttentionKind attention) {
  ActivationOptions o;
  o.inference = inference;
  o.attention = attention;
  return o;
}

std::vector<float> values(const Tensor& t) {
  return {t.data<float>(), t.data<float>() + t.numel()};
}

TEST(InferencePlan, NoBackwardNoGradientsAndAbout2BlocksOfActivations) {
  for (Family family : {Family::gpt2, Family::llama}) {
    SCOPED_TRACE(family_name(family));
    ModelConfig c = three_layers(family);
    c.n_layer = 8;  // enough blocks that keeping all of them shows
    c.finalize();
    ActivationOptions o = options(true, AttentionKind::flash);
    const StepPlan inference = plan_step(c, kB, kT, o);
    o.inference = false;
    const StepPlan training = plan_step(c, kB, kT, o);
    for (const Phase& p : inference.phases)
      EXPECT_TRUE(p.kind != PhaseKind::backward && p.kind != PhaseKind::final_norm_backward &&
                  p.kind != PhaseKind::embedding_backward)
          << p.name();
    for (const BufferSpec& b : inference.buffers) EXPECT_NE(b.category, Category::grads) << b.tag;
    const size_t act = static_cast<size_t>(Category::activations);
    // Eight blocks' saved activations against about two.
    EXPECT_LT(inference.arena[act] * 3, training.arena[act])
        << inference.arena[act] << " against " << training.arena[act];
  }
}

TEST(InferencePlan, LogitsAndLossAreTheTrainingPlansBitForBitWithNoGradientSlab) {
  for (Family family : {Family::gpt2, Family::llama}) {
    for (Precision precision : {Precision::fp32, Precision::bf16}) {
      for (AttentionKind attention : {AttentionKind::flash, AttentionKind::plain}) {
        SCOPED_TRACE(fmt::format("{} {} {}", family_name(family), precision_name(precision),
                                 attention_kind_name(attention)));
        const ModelConfig c = three_layers(family);
        MemoryPool pool;
        Transformer gpt(c, pool, {precision, true});
        gpt.init_weights(5);
        Batch batch(pool, kB, kT, c.vocab_size, 3);
        Tensor out = Tensor::empty(pool, {kB, kT, c.vocab_size}, DType::f32, Category::staging,
                                   "logits");
        gpt.reserve(kB, kT, options(false, attention));
        gpt.logits(batch.tokens, out);
        const std::vector<float> want = values(out);
        const float want_loss = gpt.forward(batch.tokens, batch.targets, false);

        gpt.reserve(kB, kT, options(true, attention));
        gpt.set_poison_dead_buffers(true);  // what died may not be read
        EXPECT_EQ(pool.bytes_current(Category::grads), 0u);
        EXPECT_FALSE(gpt.grads().defined());
        std::memset(out.raw_data(), 0xFF, out.nbytes());
        gpt.logits(batch.tokens, out);
        EXPECT_EQ(std::memcmp(values(out).data(), want.data(), want.size() * 4), 0);
        const float loss = gpt.forward(batch.tokens, batch.targets, false);
        EXPECT_EQ(std::memcmp(&loss, &want_loss, 4), 0) << loss << " against " << want_loss;

        EXPECT_THROW(gpt.forward(batch.tokens, batch.targets, true), Error);
        EXPECT_THROW(gpt.backward(), Error);

        gpt.set_poison_dead_buffers(false);
        gpt.reserve(kB, kT, options(false, attention));  // training again: the slab is back
        gpt.zero_grad();
        gpt.forward(batch.tokens, batch.targets, true);
        gpt.backward();
        ASSERT_TRUE(gpt.grads().defined());
        EXPECT_EQ(pool.bytes_current(Category::grads),
                  MemoryPool::round_up(static_cast<size_t>(gpt.layout().total()) * 4));
      }
    }
  }
}

TEST(InferencePlan, KeepingGradientsInTheArenaIsAConfigError) {
  ActivationOptions o = options(true, AttentionKind::flash);
  o.grads_in_arena = true;
  EXPECT_THROW(plan_step(three_layers(), kB, kT, o), ConfigError);
}

}  // namespace
}  // namespace memfit
