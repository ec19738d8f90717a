// Training with --update-in-backward against the ordinary step (Note [Update in backward]):
// with --clip 0, and with global clipping (two passes), the losses, the logged gradient norms and the saved checkpoint (weights,
// optimizer state, trainer state) are the same bytes for every optimizer at fp32, bf16 with
// master weights and pure bf16, for GPT-2's tied head and LLaMA's untied one, every checkpoint
// policy and activation compression; a stopped and resumed run ends with the uninterrupted
// run's files; the planner's peak by category is the measured one, with no gradient slab; the
// combinations it cannot run are refused before anything is built, naming the options.
#include <gtest/gtest.h>

#include <fstream>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/optim/backward_update.h"
#include "memfit/plan/memory_plan.h"
#include "memfit/plan/search.h"
#include "trainer_fixture.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class BackwardUpdateTrainer : public test::TrainerFixture {
 protected:
  TrainConfig base(const char* model = "gpt2-tiny") const {
    TrainConfig c = config(model);
    c.grad_accum = 1;
    c.clip = 0;
    c.steps = 3;
    c.eval_batches = 1;
    return c;
  }
  static TrainConfig fused(TrainConfig c) {
    c.update_in_backward = true;
    return c;
  }
  void expect_same_run(const TrainConfig& c, const std::string& what) {
    SCOPED_TRACE(what);
    TrainConfig a = c, b = fused(c);
    a.save_dir = (dir / "ordinary").string();
    a.log_file = (dir / "ordinary.jsonl").string();
    b.save_dir = (dir / "fused").string();
    b.log_file = (dir / "fused.jsonl").string();
    const TrainSummary ordinary = train(a);
    const TrainSummary in_backward = train(b);
    ASSERT_EQ(ordinary.losses.size(), static_cast<size_t>(c.steps));
    ASSERT_EQ(ordinary.losses.size(), in_backward.losses.size());
    for (size_t i = 0; i < ordinary.losses.size(); ++i)
      EXPECT_EQ(ordinary.losses[i], in_backward.losses[i]) << "step " << i + 1;
    // grad_norm: the units' sums of squares added in unit order, as the ordinary check adds.
    std::vector<nlohmann::json> norms[2];
    for (int k = 0; k < 2; ++k)
      for (const auto& line : read_log(dir / (k ? "fused.jsonl" : "ordinary.jsonl")))
        if (line.contains("grad_norm")) norms[k].push_back(line["grad_norm"]);
    ASSERT_EQ(norms[0].size(), static_cast<size_t>(c.steps));
    EXPECT_EQ(norms[0], norms[1]);
    expect_same_checkpoint(dir / "ordinary", dir / "fused");
    // No slab: the gradients' bytes are the unit buffers.
    const RunSpec spec = resolve_run(b);
    EXPECT_EQ(in_backward.peak_by_category[static_cast<size_t>(Category::grads)],
              BackwardUpdate::grads_bytes(ParamLayout(spec.model)));
    fs::remove_all(dir / "ordinary");
    fs::remove_all(dir / "fused");
  }
};

TEST_F(BackwardUpdateTrainer, EveryOptimizerAndPrecisionBitIdentical) {
  for (const char* optim :
       {"sgd", "adamw", "adamw8bit", "adam-mini", "lion", "lion8bit", "apollo-mini", "galore",
        "galore8bit"})
    for (const char* precision : {"fp32", "bf16"}) {
      TrainConfig c = base();
      c.optim.name = optim;
      c.precision = precision;
      expect_same_run(c, fmt::format("{} {}", optim, precision));
    }
  // Pure bf16 (no master weights: stochastic rounding), the optimizers that implement it.
  for (const char* optim : {"adamw", "adamw8bit"}) {
    TrainConfig c = base();
    c.optim.name = optim;
    c.precision = "bf16";
    c.master_weights = "none";
    expect_same_run(c, fmt::format("{} pure bf16", optim));
  }
  // fp8 (Note [FP8]): bf16's weights and update, the linears on FP8 operands.
  TrainConfig c = base();
  c.optim.name = "adamw";
  c.precision = "fp8";
  expect_same_run(c, "adamw fp8");
}

// The headline's options at a small shape (Note [Update in backward]): APOLLO-mini, whose unit
// optimizers share the run's scratch, with LLaMA's untied edges taking the one slot in turn;
// the same bits as the ordinary step, and the planned peak by category the measured one.
TEST_F(BackwardUpdateTrainer, ApolloMiniPureBf16FullCheckpointingBitIdenticalAndPlanned) {
  for (const char* model : {"llama-tiny", "gpt2-tiny"}) {
    TrainConfig c = base(model);
    c.optim.name = "apollo-mini";
    c.precision = "bf16";
    if (model == std::string("llama-tiny")) c.master_weights = "none";  // GPT-2: fp32 master
    c.ckpt = "full";
    expect_same_run(c, fmt::format("{} apollo-mini", model));
    TrainConfig f = fused(c);
    f.steps = 2;
    f.save_dir = (dir / "save").string();
    const PlanReport plan = plan_training(resolve_run(f));
    const TrainSummary s = train(f);
    for (Category cat : kAllCategories)
      EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                s.peak_by_category[static_cast<size_t>(cat)])
          << model << " " << category_name(cat);
    EXPECT_EQ(plan.peak_bytes, s.peak_bytes) << model;
    fs::remove_all(dir / "save");
  }
}

TEST_F(BackwardUpdateTrainer, GlobalClippingInTwoPassesBitIdentical) {
  // Clipping that acts on every step: a measuring backward, then the stepping one.
  for (const char* optim : {"adamw", "adamw8bit", "lion"})
    for (const char* model : {"gpt2-tiny", "llama-tiny"}) {
      TrainConfig c = base(model);
      c.optim.name = optim;
      c.precision = "bf16";
      c.clip = 0.05f;
      c.ckpt = "every:2";
      expect_same_run(c, fmt::format("{} {} --clip 0.05", model, optim));
    }
}

TEST_F(BackwardUpdateTrainer, UntiedHeadPoliciesAndCompressionBitIdentical) {
  // LLaMA's untied head is the tail's, finished by the forward's LM head; GPT-2's tied table is
  // the embeddings', finished last.
  for (const char* model : {"llama-tiny", "gpt2-tiny"})
    for (const char* ckpt : {"none", "full", "every:2", "layers:0"}) {
      TrainConfig c = base(model);
      c.precision = "bf16";
      c.optim.name = "adamw8bit";
      c.ckpt = ckpt;
      expect_same_run(c, fmt::format("{} --ckpt {}", model, ckpt));
    }
  TrainConfig c = base();
  c.act_compress = "int8";
  expect_same_run(c, "gpt2-tiny --act-compress int8");
  c = base();
  c.attention = "plain";
  c.ckpt = "selective";
  expect_same_run(c, "gpt2-tiny plain attention --ckpt selective");
}

TEST_F(BackwardUpdateTrainer, PlannedPeakEqualsMeasured) {
  for (int shape = 0; shape < 5; ++shape) {  // shape 4: gpt2 in fp8 (Note [FP8])
    SCOPED_TRACE(shape);
    TrainConfig c = fused(base(shape % 2 ? "llama-tiny" : "gpt2-tiny"));
    if (shape >= 2) {
      c.precision = shape == 4 ? "fp8" : "bf16";
      c.ckpt = "full";
      c.n_layer = 6;
      c.batch = 2;
      c.seq_len = 64;
    }
    c.steps = 2;
    c.save_dir = (dir / "save").string();
    const RunSpec spec = resolve_run(c);
    const PlanReport plan = plan_training(spec);
    const TrainSummary s = train(c);
    EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
    for (Category cat : kAllCategories)
      EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                s.peak_by_category[static_cast<size_t>(cat)])
          << category_name(cat);
    EXPECT_EQ(plan.by_category[static_cast<size_t>(Category::grads)],
              BackwardUpdate::grads_bytes(ParamLayout(spec.model)));
    EXPECT_FALSE(plan.step.options.grads_in_arena);
    fs::remove_all(dir / "save");
  }
}

TEST_F(BackwardUpdateTrainer, HoldsLessThanTheSlabWithManyBlocks) {
  // The unit buffers: one slot every unit takes in turn (and the tied table), against the ordinary run's f32 slab (in its
  // activations arena) at 16 blocks.
  TrainConfig c = base();
  c.n_layer = 16;
  c.ckpt = "full";
  const PlanReport ordinary = plan_training(resolve_run(c));
  const PlanReport in_backward = plan_training(resolve_run(fused(c)));
  const int64_t slab = ParamLayout(resolve_run(c).model).total() * 4;
  EXPECT_LT(in_backward.peak_bytes + static_cast<size_t>(slab) / 2, ordinary.peak_bytes);
}

TEST_F(BackwardUpdateTrainer, StoppedAndResumedIsBitIdentical) {
  TrainConfig c = fused(base());
  c.steps = 6;
  c.precision = "bf16";
  c.optim.name = "adamw8bit";
  c.save_dir = (dir / "whole").string();
  train(c);
  // Stopped after 3, resumed with the flag, and resumed without it (the state is the same).
  for (const bool resume_ordinary : {false, true}) {
    SCOPED_TRACE(resume_ordinary ? "resumed ordinary" : "resumed in backward");
    TrainConfig s = c;
    s.save_dir = (dir / (resume_ordinary ? "b" : "a")).string();
    s.stop_after = 3;
    train(s);
    TrainConfig r = s;
    r.stop_after = 0;
    r.resume_dir = s.save_dir;
    r.update_in_backward = !resume_ordinary;
    train(r);
    expect_same_checkpoint(dir / "whole", s.save_dir);
  }
}

TEST_F(BackwardUpdateTrainer, ClipModeUnitTrains) {
  // Per-unit clipping small enough to act on every unit: the loss still falls on the learnable
  // stream, and the run is not the unclipped one.
  TrainConfig c = fused(base());
  c.clip_mode = "unit";
  c.clip = 0.05f;
  c.steps = 6;
  const TrainSummary clipped = train(c);
  c.clip = 0;
  const TrainSummary free = train(c);
  ASSERT_EQ(clipped.losses.size(), 6u);
  EXPECT_LT(clipped.losses.back(), clipped.losses.front());
  EXPECT_NE(clipped.losses.back(), free.losses.back());
}

TEST_F(BackwardUpdateTrainer, ProfiledTwoPassRunIsThePlannedRunWithoutLeaks) {
  // --profile over the two passes of global clipping: the same losses as without it, the
  // measured peak by category the planner's, no growth between steps.
  TrainConfig c = fused(base());
  c.clip = 0.05f;
  const TrainSummary plain = train(c);
  c.profile_dir = (dir / "profile").string();
  const TrainSummary profiled = train(c);
  ASSERT_EQ(plain.losses.size(), profiled.losses.size());
  for (size_t i = 0; i < plain.losses.size(); ++i) EXPECT_EQ(plain.losses[i], profiled.losses[i]);
  std::ifstream in(dir / "profile" / "summary.json");
  const nlohmann::json summary = nlohmann::json::parse(in);
  EXPECT_EQ(summary["measured"]["peak_bytes"], profiled.peak_bytes);
  EXPECT_EQ(summary["measured"]["by_category"], summary["planned"]["by_category"]);
  EXPECT_FALSE(profiled.leak.leaked()) << profiled.leak.text();
}

std::string refusal(const TrainConfig& c) {
  try {
    resolve_auto(c);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "accepted";
}

TEST_F(BackwardUpdateTrainer, RefusesWhatItCannotRunNamingTheOptions) {
  const TrainConfig ok = fused(base());
  EXPECT_EQ(refusal(ok), "accepted");
  auto expect = [&](TrainConfig c, const std::vector<std::string>& words) {
    const std::string m = refusal(c);
    for (const std::string& w : words) EXPECT_NE(m.find(w), std::string::npos) << m;
  };
  TrainConfig c = ok;
  c.clip = 1.0f;  // the default, on the global norm: two passes
  EXPECT_EQ(refusal(c), "accepted");
  c.clip_mode = "unit";
  EXPECT_EQ(refusal(c), "accepted");
  c = ok;
  c.grad_accum = 2;
  expect(c, {"--update-in-backward", "--grad-accum 2"});
  c = ok;
  c.precision = "fp16";
  c.attention = "plain";
  expect(c, {"--update-in-backward", "--precision fp16", "overflow"});
  c = ok;
  c.grad_dtype = "bf16";
  expect(c, {"--update-in-backward", "--grad-dtype bf16"});
  c = ok;
  c.offload_optimizer = "nvme";
  c.offload_dir = (dir / "offload").string();
  EXPECT_EQ(refusal(c), "accepted");  // streamed in the backward (backward_update_offload_test)
  c.offload_grads = "nvme";
  expect(c, {"--update-in-backward", "--offload-grads", "no gradient file"});
  c = ok;
  c.ranks = 2;
  expect(c, {"--update-in-backward", "2 ranks"});
  c = base();
  c.clip_mode = "unit";
  expect(c, {"--clip-mode unit", "needs --update-in-backward"});
  c = ok;
  c.clip_mode = "layer";
  expect(c, {"--clip-mode", "global or unit"});
  EXPECT_FALSE(fs::exists(dir / "offload"));
}

TEST_F(BackwardUpdateTrainer, SearchKeepsOneMicroBatchAndTheRunInRam) {
  // --auto-batch with the flag tries only the whole batch (accumulation is refused), and
  // --offload-dir offers no offloaded candidate.
  TrainConfig c = fused(base());
  c.batch = 2;
  c.grad_accum = 1;
  c.auto_batch = true;
  c.ckpt = "auto";
  c.mem_limit = "1GiB";
  c.offload_dir = (dir / "offload").string();
  const RunSpec spec = resolve_run(c);
  const SearchResult r = search_training(spec, spec.mem_limit, SearchSpace::of(spec));
  ASSERT_FALSE(r.candidates.empty());
  for (const Candidate& k : r.candidates) {
    EXPECT_EQ(k.grad_accum, 1);
    EXPECT_FALSE(k.offload);
  }
  EXPECT_TRUE(r.fits);
}

}  // namespace
}  // namespace memfit
