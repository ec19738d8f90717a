// Transformer on its step arena (Note [Step arena]): with dead buffers poisoned (NaN outside each
// lifetime), a step on the arena gives bit for bit the loss, logits and gradients of the same
// step with every buffer in bytes of its own, under every checkpoint policy, attention kind and
// precision, with and without --act-compress; shortening any buffer's lifetime by one phase
// breaks that, which shows the check catches a wrong lifetime; and the engine refuses to run
// phases out of the schedule's order.
#include <gtest/gtest.h>

#include <omp.h>

#include <cstring>

#include "gpt2_test_util.h"
#include "memfit/model/transformer.h"

namespace memfit {
namespace {

using namespace gpt2_test;

ActivationOptions options(const char* ckpt, AttentionKind attention, Precision precision,
                          ActCompress compress = ActCompress::none) {
  ActivationOptions o;
  o.ckpt = CheckpointPolicy::parse(ckpt);
  o.attention = attention;
  o.precision = precision;
  o.act_compress = compress;
  o.lm_head_chunk = 5;  // several chunks, the last one short
  return o;
}

// The plan with every buffer live for the whole step: nothing shares bytes.
StepPlan unshared(StepPlan plan) {
  for (BufferSpec& b : plan.buffers)
    b.lifetime = {{{0, static_cast<int>(plan.phases.size()) - 1}}};
  layout_arenas(plan);
  return plan;
}

struct Outcome {
  std::vector<float> losses, logits, grads;
  bool operator==(const Outcome& o) const {
    auto same = [](const std::vector<float>& a, const std::vector<float>& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
    };
    return same(losses, o.losses) && same(logits, o.logits) && same(grads, o.grads);
  }
};

constexpr int kB = 2, kT = 13;

// Two micro-batches into one gradient, with an evaluation forward and the logits between them:
// every way the engine walks the schedule (a whole step, a prefix, a new micro-batch).
Outcome run(Transformer& gpt, StepPlan plan, bool poison, MemoryPool& pool) {
  const ModelConfig& c = gpt.config();
  gpt.reserve(std::move(plan));
  gpt.set_poison_dead_buffers(poison);
  Batch one(pool, kB, kT, c.vocab_size, 1), two(pool, kB, kT, c.vocab_size, 7);
  Tensor logits = Tensor::empty(pool, {kB, kT, c.vocab_size}, DType::f32, Category::staging, "l");
  Outcome r;
  gpt.zero_grad();
  r.losses.push_back(gpt.forward(one.tokens, one.targets, true, 1024.0f));
  gpt.backward();
  r.losses.push_back(gpt.forward(two.tokens, two.targets, false));
  gpt.logits(two.tokens, logits);
  r.losses.push_back(gpt.forward(two.tokens, two.targets, true, 1024.0f));
  gpt.backward();
  r.logits.assign(logits.data<float>(), logits.data<float>() + logits.numel());
  r.grads.assign(gpt.grads().data<float>(), gpt.grads().data<float>() + gpt.grads().numel());
  return r;
}

struct Case {
  const char* ckpt;
  AttentionKind attention;
  Precision precision;
  Family family = Family::gpt2;
  ActCompress compress = ActCompress::none;
};

std::string case_name(const Case& k) {
  std::string n = fmt::format("{}_{}_{}_{}", family_name(k.family), k.ckpt,
                              attention_kind_name(k.attention), precision_name(k.precision));
  if (k.compress != ActCompress::none) n += fmt::format("_{}", act_compress_name(k.compress));
  for (char& ch : n)
    if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
  return n;
}

void PrintTo(const Case& k, std::ostream* os) { *os << case_name(k); }

class StepArena : public ::testing::TestWithParam<Case> {};

TEST_P(StepArena, StepWithDeadBuffersPoisonedEqualsUnsharedStep) {
  const Case& k = GetParam();
  const ModelConfig c = three_layers(k.family);
  MemoryPool pool;
  Transformer gpt(c, pool, {k.precision, true});
  gpt.init_weights(5);
  const StepPlan plan =
      plan_step(c, kB, kT, options(k.ckpt, k.attention, k.precision, k.compress));
  const StepPlan reference = unshared(plan);
  for (Category cat : {Category::activations, Category::workspace})
    EXPECT_EQ(reference.arena[static_cast<size_t>(cat)], plan_bytes(plan.buffers, cat));
  const Outcome want = run(gpt, reference, false, pool);
  for (float loss : want.losses) EXPECT_TRUE(std::isfinite(loss));
  EXPECT_TRUE(run(gpt, plan, true, pool) == want)
      << "a buffer is used outside the lifetime the step schedule gives it";
}

std::vector<Case> cases() {
  std::vector<Case> out;
  for (Family f : {Family::gpt2, Family::llama}) {
    for (const char* ck : {"none", "full", "selective", "every:2", "layers:1"})
      for (AttentionKind a : {AttentionKind::flash, AttentionKind::plain})
        for (Precision p : {Precision::fp32, Precision::bf16}) out.push_back({ck, a, p, f});
    for (const char* ck : {"none", "selective", "every:2"})
      out.push_back({ck, AttentionKind::plain, Precision::fp16, f});
    // --precision fp8: the FP8 operand buffers (ws.fp8.*), used within each block phase.
    for (const char* ck : {"none", "selective", "every:2"})
      out.push_back({ck, ck[0] == 's' ? AttentionKind::plain : AttentionKind::flash,
                     Precision::fp8, f});
    // --act-compress: the codes and scales, and the exact values' scratch shared by the blocks.
    for (ActCompress z : {ActCompress::int8, ActCompress::fp8}) {
      out.push_back({"none", AttentionKind::flash, Precision::bf16, f, z});
      out.push_back({"layers:1", AttentionKind::plain, Precision::fp32, f, z});
      out.push_back({"selective", AttentionKind::plain, Precision::fp16, f, z});
    }
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Policies, StepArena, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return case_name(info.param); });

// The check can fail: for every buffer that carries a value from one phase to a later one,
// ending that span one phase early (so the buffer is poisoned before its last read, and its
// bytes are free for others there) changes the results.
TEST(StepArenaCheck, EveryLifetimeShortenedByOnePhaseIsCaught) {
  // Hundreds of tiny steps: on one thread, because each kernel's OpenMP barrier waits for a
  // descheduled thread when ctest runs another test beside this one on the same cores (288 s
  // instead of 3 once in CI). What it checks does not depend on threads.
  const int threads = omp_get_max_threads();
  omp_set_num_threads(1);
  for (const Case& k : {Case{"none", AttentionKind::flash, Precision::fp32},
                        Case{"every:2", AttentionKind::plain, Precision::bf16},
                        Case{"selective", AttentionKind::plain, Precision::fp16},
                        Case{"none", AttentionKind::flash, Precision::fp32, Family::llama},
                        Case{"every:2", AttentionKind::flash, Precision::bf16, Family::llama},
                        Case{"layers:1", AttentionKind::plain, Precision::bf16, Family::gpt2,
                             ActCompress::int8}}) {
    SCOPED_TRACE(case_name(k));
    const ModelConfig c = three_layers(k.family);
    MemoryPool pool;
    Transformer gpt(c, pool, {k.precision, true});
    gpt.init_weights(5);
    const StepPlan plan =
        plan_step(c, kB, kT, options(k.ckpt, k.attention, k.precision, k.compress));
    const Outcome want = run(gpt, plan, true, pool);
    int mutants = 0;
    for (size_t i = 0; i < plan.buffers.size(); ++i)
      for (size_t s = 0; s < plan.buffers[i].lifetime.spans.size(); ++s) {
        if (plan.buffers[i].lifetime.spans[s].first == plan.buffers[i].lifetime.spans[s].last)
          continue;
        StepPlan wrong = plan;
        LiveSpan& span = wrong.buffers[i].lifetime.spans[s];
        --span.last;
        layout_arenas(wrong);
        EXPECT_FALSE(run(gpt, wrong, true, pool) == want)
            << plan.buffers[i].tag << " ending at " << plan.phases[span.last].name()
            << " instead of " << plan.phases[span.last + 1].name() << " went unnoticed";
        ++mutants;
      }
    EXPECT_GT(mutants, 30);
  }
  omp_set_num_threads(threads);
}

TEST(StepArenaCheck, EngineRefusesToLeaveTheSchedule) {
  const ModelConfig c = three_layers();
  MemoryPool pool;
  Transformer gpt(c, pool);
  gpt.init_weights(5);
  StepPlan plan = plan_step(c, kB, kT, options("none", AttentionKind::flash, Precision::fp32));
  std::swap(plan.phases[1], plan.phases[2]);  // forward of block 1 before block 0
  gpt.reserve(std::move(plan));
  Batch b(pool, kB, kT, c.vocab_size, 1);
  EXPECT_THROW(gpt.forward(b.tokens, b.targets, true), Error);
}

}  // namespace
}  // namespace memfit
