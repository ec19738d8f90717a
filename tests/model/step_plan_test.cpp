// The step plan: the schedule's phases in the engine's order, the lifetimes derived from it
// (spot checks against what gpt2.cpp does), and the live bytes per phase and the peak phase.
// Whether the lifetimes are true of the engine is tests/model/gpt2_arena_test.cpp's job.
#include "memfit/model/step_plan.h"

#include <gtest/gtest.h>

#include "gpt2_test_util.h"
#include "memfit/kernels/cpu/matmul_widened.h"

namespace memfit {
namespace {

using namespace gpt2_test;

ActivationOptions options(const char* ckpt, AttentionKind attention = AttentionKind::flash,
                          Precision precision = Precision::fp32) {
  ActivationOptions o;
  o.ckpt = CheckpointPolicy::parse(ckpt);
  o.attention = attention;
  o.precision = precision;
  o.lm_head_chunk = 5;  // several chunks, the last one short
  return o;
}

// "first..last" for each span of the buffer's lifetime, by phase name.
std::string spans(const StepPlan& plan, const std::string& tag) {
  for (const BufferSpec& b : plan.buffers) {
    if (b.tag != tag) continue;
    std::string out;
    for (const LiveSpan& s : b.lifetime.spans)
      out += fmt::format("{}{}..{}", out.empty() ? "" : ", ", plan.phases[s.first].name(),
                         plan.phases[s.last].name());
    return out;
  }
  return "(no such buffer)";
}

constexpr int kB = 2, kT = 13;

TEST(StepPlan, PhasesFollowTheEngine) {
  const ModelConfig c = three_layers();
  const StepPlan full = plan_step(c, kB, kT, options("full"));
  std::vector<std::string> names;
  for (const Phase& p : full.phases) names.push_back(p.name());
  EXPECT_EQ(names, (std::vector<std::string>{
                       "embedding", "forward of block 0", "forward of block 1",
                       "forward of block 2", "final norm", "LM head", "backward of the final norm",
                       "recomputation of block 2", "backward of block 2",
                       "recomputation of block 1", "backward of block 1",
                       "recomputation of block 0", "backward of block 0", "embedding backward"}));
  const StepPlan every = plan_step(c, kB, kT, options("every:2"));
  EXPECT_EQ(every.phases[7].name(), "recomputation of block 2");
  EXPECT_EQ(every.phases[9].name(), "recomputation of block 0");
  EXPECT_EQ(every.phases[10].name(), "recomputation of block 1");
  EXPECT_EQ(every.phases[11].name(), "backward of block 1");
}

TEST(StepPlan, LifetimesFollowTheCode) {
  const ModelConfig c = three_layers();
  const StepPlan none = plan_step(c, kB, kT, options("none"));
  EXPECT_EQ(spans(none, "ws.logits"), "LM head..LM head");
  EXPECT_EQ(spans(none, "tokens"), "LM head..embedding backward");
  EXPECT_EQ(spans(none, "encoded"), "embedding..backward of block 0");
  EXPECT_EQ(spans(none, "h.1.qkv"), "forward of block 1..backward of block 1");
  EXPECT_EQ(spans(none, "h.1.residual_3"), "forward of block 1..backward of block 2");
  EXPECT_EQ(spans(none, "ln_f"), "final norm..LM head");
  EXPECT_EQ(spans(none, "ln_f.rstd"), "final norm..backward of the final norm");
  EXPECT_EQ(spans(none, "ws.dresidual"), "backward of the final norm..embedding backward");
  // ws.dC: the projections' scratch in each forward and backward, and d(ln_f) from the head.
  EXPECT_EQ(spans(none, "ws.dC"),
            "forward of block 0..forward of block 0, forward of block 1..forward of block 1, "
            "forward of block 2..forward of block 2, LM head..backward of the final norm, "
            "backward of block 2..backward of block 2, backward of block 1..backward of block 1, "
            "backward of block 0..backward of block 0");

  // A recomputation slot holds a block in forward and again from its recomputation to its
  // backward; between those, and through the LM head, its bytes are free.
  const StepPlan full = plan_step(c, kB, kT, options("full"));
  EXPECT_EQ(spans(full, "rc.0.fch"),
            "forward of block 0..forward of block 0, forward of block 1..forward of block 1, "
            "forward of block 2..forward of block 2, "
            "recomputation of block 2..backward of block 2, "
            "recomputation of block 1..backward of block 1, "
            "recomputation of block 0..backward of block 0");
  // A segment's output is kept to the backward of the next block, then rewritten (unread) by
  // the recomputation.
  EXPECT_EQ(spans(full, "h.1.residual_3"),
            "forward of block 1..backward of block 2, "
            "recomputation of block 1..recomputation of block 1");
  EXPECT_LT(full.live[5].activations, full.live[8].activations)
      << "the LM head holds no recomputation slot, the backward of block 2 does";
}

TEST(StepPlan, PeakIsInAPhaseAndLiveBytesNeverPassTheArenas) {
  const ModelConfig c = ModelConfig::preset("gpt2");
  for (const char* ckpt : {"none", "full", "every:3"}) {
    const StepPlan plan = plan_step(c, 8, 256, options(ckpt));
    for (const PhaseBytes& live : plan.live) {
      EXPECT_LE(live.activations, plan.arena[static_cast<size_t>(Category::activations)]);
      EXPECT_LE(live.workspace, plan.arena[static_cast<size_t>(Category::workspace)]);
    }
    const int peak = plan.peak_phase();
    for (const PhaseBytes& live : plan.live) EXPECT_LE(live.total(), plan.live[peak].total());
    EXPECT_NE(plan.phases[peak].kind, PhaseKind::embedding) << ckpt;
  }
}

// Note [Fused LM head], "The chunk": unasked, the head takes the route's default chunk doubled
// for as long as the arenas come out no larger, and the plan records it; asked, it takes what
// was asked. gpt2's shapes, where each outcome happens somewhere: at 8 x 256 in fp32 twice the
// chunk would cost 0.5 MiB, at 16 x 256 in fp32 nothing, and fp16 at 16 x 256 doubles twice.
TEST(StepPlan, TheLmHeadDoublesItsChunkWhileThatCostsNoArenaByte) {
  const ModelConfig c = ModelConfig::preset("gpt2");
  auto arenas = [](const StepPlan& p) {
    return p.arena[static_cast<size_t>(Category::activations)] +
           p.arena[static_cast<size_t>(Category::workspace)];
  };
  int kept = 0, doubled = 0, doubled_twice = 0;
  for (Precision precision : {Precision::fp32, Precision::bf16, Precision::fp16})
    for (int B : {4, 8, 16}) {
      ActivationOptions o = options("none", precision == Precision::fp16 ? AttentionKind::plain
                                                                          : AttentionKind::flash,
                                    precision);
      o.lm_head_chunk = 0;
      const StepPlan chosen = plan_step(c, B, 256, o);
      const int d = static_cast<int>(default_lm_head_chunk(o));
      SCOPED_TRACE(fmt::format("{} x 256, {}, default chunk {}", B, precision_name(precision), d));
      EXPECT_EQ(chosen.lm_head_chunk_asked, 0);
      // The chunk as asked, for every doubling of the default up to the step's rows.
      auto given = [&](int chunk) {
        o.lm_head_chunk = chunk;
        const StepPlan p = plan_step(c, B, 256, o);
        EXPECT_EQ(p.lm_head_chunk_asked, chunk);
        EXPECT_EQ(p.options.lm_head_chunk, chunk);
        return p;
      };
      const size_t base = arenas(given(d));
      int want = d;
      while (2 * want <= B * 256 && arenas(given(2 * want)) <= base) want *= 2;
      EXPECT_EQ(chosen.options.lm_head_chunk, want);
      EXPECT_EQ(arenas(chosen), arenas(given(want)));
      EXPECT_LE(arenas(chosen), base);
      kept += want == d;
      doubled += want == 2 * d;
      doubled_twice += want >= 4 * d;
    }
  EXPECT_GT(kept, 0);
  EXPECT_GT(doubled, 0);
  EXPECT_GT(doubled_twice, 0);  // fp16 (always widened) at 16 x 256 takes 512 rows
}

TEST(StepPlan, OnOneDnnsBf16GemmTheHeadsGradientGathers512Rows) {
  // The LM head's f32 logits take a chunk of rows, its bf16 gradient (on oneDNN's bf16 GEMM)
  // kLmHeadGradRows: at the default chunk the bytes of the old 256-row chunk's logits and
  // gradient together. fp32 has no separate gradient, nor has the widened route, which rounds
  // it in place in the logits.
  const ModelConfig c = ModelConfig::preset("gpt2");
  auto rows = [](const StepPlan& p, const char* tag) -> int64_t {
    for (const BufferSpec& b : p.buffers)
      if (b.tag == tag) return b.shape[0];
    return 0;
  };
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(precision));
    ActivationOptions o = options("none", AttentionKind::flash, precision);
    o.lm_head_chunk = 0;  // the plan's choice
    const StepPlan p = plan_step(c, 8, 256, o);
    const int64_t chunk = p.options.lm_head_chunk;
    EXPECT_EQ(rows(p, "ws.logits"), chunk);
    EXPECT_EQ(lm_head_rows(p.options, 2048), chunk);
    if (precision == Precision::fp32 || kernels::matmul_widens(DType::bf16)) {
      EXPECT_EQ(rows(p, "ws.dlogits"), 0);
      EXPECT_EQ(lm_head_grad_rows(p.options, 2048), chunk);
    } else {
      EXPECT_EQ(chunk, 128);  // gathering keeps the default: twice it would cost 24.6 MiB here
      EXPECT_EQ(rows(p, "ws.dlogits"), kLmHeadGradRows);
      EXPECT_EQ(lm_head_grad_rows(p.options, 300), 300);  // never more than the step's rows
      EXPECT_EQ(lm_head_dx_rows(p.options, 2048), kLmHeadGradRows / 2);
    }
  }
}

TEST(StepPlan, TheHeadsGroupIsAskedRowsAndDNormTakesHalfOfIt) {
  // --lm-head-group 2048 gathers the whole gpt2 8 x 256 step's logit gradients for one d(head)
  // GEMM, and d(norm) runs 1024 rows at a time; where the gradient is not grouped both stay a
  // chunk. A group below the chunk is the chunk; a negative one is a ConfigError.
  const ModelConfig c = ModelConfig::preset("gpt2");
  for (Precision precision : {Precision::fp32, Precision::bf16}) {
    SCOPED_TRACE(precision_name(precision));
    ActivationOptions o = options("none", AttentionKind::flash, precision);
    o.lm_head_chunk = 0;
    o.lm_head_group = 2048;
    const StepPlan p = plan_step(c, 8, 256, o);
    const int64_t chunk = p.options.lm_head_chunk;
    const bool grouped = precision == Precision::bf16 && !kernels::matmul_widens(DType::bf16);
    EXPECT_EQ(lm_head_grad_rows(p.options, 2048), grouped ? 2048 : chunk);
    EXPECT_EQ(lm_head_dx_rows(p.options, 2048), grouped ? 1024 : chunk);
    int64_t dlogits_rows = 0;
    for (const BufferSpec& b : p.buffers)
      if (b.tag == "ws.dlogits") dlogits_rows = b.shape[0];
    EXPECT_EQ(dlogits_rows, grouped ? 2048 : 0);
    ActivationOptions small = p.options;
    small.lm_head_group = 3;
    EXPECT_EQ(lm_head_grad_rows(small, 2048), chunk);
  }
  ActivationOptions bad = options("none");
  bad.lm_head_group = -1;
  EXPECT_THROW(check_activation_options(bad), ConfigError);
}

}  // namespace
}  // namespace memfit
