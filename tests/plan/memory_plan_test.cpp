// The planner's prediction against what training measures: over models, checkpoint policies,
// precisions, attention kinds, batch sizes and activation compression, the predicted peak
// equals the pool's measured peak byte for byte, category by category (a reduced grid; bench/
// runs the full one); and the moment of the peak is the phase of the step where the most bytes
// are live.
#include "memfit/plan/memory_plan.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <vector>

#include "memfit/cli/options/resolve_train_spec.h"
#include "memfit/cli/options/train_from_config.h"
#include "memfit/io/data/loss_mask.h"
#include "memfit/io/data/token_shard.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/model/param_layout.h"
#include "memfit/plan/calibration.h"

namespace memfit {
namespace {

namespace fs = std::filesystem;

class Planner : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir = fs::temp_directory_path() / fmt::format("memfit_plan_{}", ::getpid());
    fs::remove_all(dir);
    fs::create_directories(dir);
    std::vector<uint16_t> train(20000), val(3000);
    uint32_t x = 7;
    for (auto& t : train) t = static_cast<uint16_t>((x = x * 1103515245u + 12345u) >> 16) % 500;
    for (auto& t : val) t = static_cast<uint16_t>((x = x * 1103515245u + 12345u) >> 16) % 500;
    io::write_token_shard(dir / "train_000000.bin", train);
    io::write_token_shard(dir / "val_000000.bin", val);
  }
  static void TearDownTestSuite() { fs::remove_all(dir); }
  static inline fs::path dir;
};

TEST_F(Planner, PredictedPeakEqualsMeasuredPeakByCategory) {
  int runs = 0;
  for (int layers : {2, 3})
    for (const char* ckpt : {"none", "full", "selective", "every:2", "layers:1"})
      for (const char* precision : {"fp32", "bf16"})
        for (const char* attention : {"flash", "plain"})
          for (int batch : {1, 3}) {
            TrainConfig c;
            c.model = "gpt2-tiny";
            c.n_layer = layers;
            c.seq_len = 48;
            c.data_dir = dir.string();
            c.batch = batch;
            c.steps = 1;
            c.eval_batches = 1;
            c.ckpt = ckpt;
            c.precision = precision;
            c.attention = attention;
            const PlanReport plan = plan_training(resolve_run(c));
            const TrainSummary s = train(c);
            SCOPED_TRACE(fmt::format("{} layers, --ckpt {}, {}, {}, batch {}", layers, ckpt,
                                     precision, attention, batch));
            EXPECT_TRUE(plan.data_included);
            EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
            for (Category cat : kAllCategories)
              EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                        s.peak_by_category[static_cast<size_t>(cat)])
                  << category_name(cat);
            ++runs;
          }
  EXPECT_EQ(runs, 80);
}

// The optimizers with less state (Note [4-bit optimizer], Note [bf16 optimizer state], Note
// [GaLore]): planned = measured, category by category, at two shapes, fp32 and bf16 with bf16
// gradients (whose widening buffer, a whole matrix for adamw4bit and GaLore, is staging).
TEST_F(Planner, PredictedPeakEqualsMeasuredPeakForTheSmallStateOptimizers) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"})
    for (const char* optim : {"adamw4bit", "adamw:bf16", "galore", "galore8bit"})
      for (const char* precision : {"fp32", "bf16"}) {
        TrainConfig c;
        c.model = model;
        c.n_layer = 2;
        c.seq_len = 32;
        c.data_dir = dir.string();
        c.batch = 2;
        c.steps = 1;
        c.eval_batches = 1;
        c.precision = precision;
        if (c.precision == "bf16") c.grad_dtype = "bf16";
        c.optim.name = optim;
        if (c.optim.name == "adamw:bf16") {
          c.optim.name = "adamw";
          c.optim.state_dtype = DType::bf16;
        }
        const PlanReport plan = plan_training(resolve_run(c));
        const TrainSummary s = train(c);
        SCOPED_TRACE(fmt::format("{}, {}, {}", model, optim, precision));
        EXPECT_GT(plan.by_category[static_cast<size_t>(Category::optimizer)], 0u);
        EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
        for (Category cat : kAllCategories)
          EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                    s.peak_by_category[static_cast<size_t>(cat)])
              << category_name(cat);
      }
}

// The set-up fills the working copy through one staging piece (Transformer::set_weights) while
// the step's arenas do not exist yet; setup_piece_elements keeps it within the activation arena,
// so the run's peak stays the step's and the plan is exact. A pure-bf16 run of a model whose f32
// layout is far larger than a tiny step's activation arena puts the whole working copy through
// the piece, from initial weights and from a checkpoint (--init-from).
TEST_F(Planner, SetUpPieceStaysUnderTheStep) {
  TrainConfig c;
  c.model = "gpt2-tiny";
  c.n_layer = 2;
  c.seq_len = 8;
  c.data_dir = dir.string();
  c.batch = 1;
  c.steps = 1;
  c.eval_batches = 1;
  c.precision = "bf16";
  c.master_weights = "none";
  // Two micro-batches a step: with one, the f32 gradient slab lies in the activations arena
  // (Note [Gradients by lifetime]), which is then larger than the layout's f32 and the bound
  // cannot bind (nor matter: the setup runs before the arena, which holds the slab's bytes).
  c.grad_accum = 2;
  // Two threads, on any machine: the attention workspaces hold a slice per thread, and on 16
  // the arenas of this 2-layer model outgrow its f32 layout (3.5 MB against 1.1), which the
  // bound's premise below needs them not to.
  c.threads = 2;
  c.save_dir = (dir / "setup-ck").string();
  for (bool from_checkpoint : {false, true}) {
    SCOPED_TRACE(from_checkpoint ? "--init-from" : "initial weights");
    if (from_checkpoint) {
      c.init_from = c.save_dir;
      c.save_dir.clear();
    }
    const PlanReport plan = plan_training(resolve_run(c));
    const int64_t piece = setup_piece_elements(plan.step);
    const ParamLayout layout(plan.model);
    // The bound binds: an unbounded piece (the whole f32 layout) would be the run's peak.
    EXPECT_LT(piece, layout.total());
    EXPECT_GT(static_cast<size_t>(layout.total()) * sizeof(float),
              plan.by_category[static_cast<size_t>(Category::activations)] +
                  plan.by_category[static_cast<size_t>(Category::workspace)] +
                  plan.by_category[static_cast<size_t>(Category::staging)]);
    EXPECT_LE(static_cast<size_t>(piece) * sizeof(float),
              plan.by_category[static_cast<size_t>(Category::activations)]);
    const TrainSummary s = train(c);
    EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
    for (Category cat : kAllCategories)
      EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                s.peak_by_category[static_cast<size_t>(cat)])
          << category_name(cat);
  }
}

TEST_F(Planner, PredictedPeakEqualsMeasuredPeakWithCompression) {
  // --act-compress: the codes and scales (activations) and the exact values' scratch
  // (workspace), under policies that keep every block, some, or recompute attention only.
  // Each format with each precision once or twice (the codes' size does not depend on it).
  const std::pair<const char*, const char*> kinds[] = {
      {"fp32", "int8"}, {"bf16", "fp8"}, {"bf16", "int8"}, {"fp16", "fp8"}};
  int runs = 0;
  for (const char* ckpt : {"none", "selective", "layers:1"})
    for (const auto& [precision, compress] : kinds)
      for (const char* attention : {"flash", "plain"}) {
        if (std::string(precision) == "fp16" && std::string(attention) == "flash") continue;
        TrainConfig c;
        c.model = "gpt2-tiny";
        c.n_layer = 2;
        c.seq_len = 48;
        c.data_dir = dir.string();
        c.batch = 3;
        c.steps = 1;
        c.eval_batches = 1;
        c.ckpt = ckpt;
        c.precision = precision;
        c.attention = attention;
        c.act_compress = compress;
        const PlanReport plan = plan_training(resolve_run(c));
        const TrainSummary s = train(c);
        SCOPED_TRACE(fmt::format("--ckpt {}, {}, --act-compress {}, {}", ckpt, precision,
                                 compress, attention));
        EXPECT_EQ(s.act_compress, compress);
        EXPECT_GT(plan.step_time.compression, 0);
        EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
        for (Category cat : kAllCategories)
          EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                    s.peak_by_category[static_cast<size_t>(cat)])
              << category_name(cat);
        ++runs;
      }
  EXPECT_EQ(runs, 21);
}

// A run that saves from RAM: the writer's staging (GPT-2's transposed Conv1D weights, about 4
// MiB of a band at a time; LLaMA none) comes from the pool and is in the plan, byte for byte,
// in fp32, bf16 with master weights and pure bf16; and not in a run that does not save.
TEST_F(Planner, ASaveFromRamIsPlannedWithItsStaging) {
  for (const char* model : {"gpt2-tiny", "llama-tiny"})
    for (const char* precision : {"fp32", "bf16", "pure"}) {
      TrainConfig c;
      c.model = model;
      c.n_layer = 2;
      c.d_model = 512;  // a Conv1D weight larger than one 4 MiB band: several bands
      c.n_head = 4;
      c.seq_len = 32;
      c.batch = 2;
      c.data_dir = dir.string();
      c.steps = 1;
      c.eval_batches = 1;
      c.precision = std::string(precision) == "pure" ? "bf16" : precision;
      if (std::string(precision) == "pure") c.master_weights = "none";
      const PlanReport without = plan_training(resolve_run(c));
      c.save_dir = (dir / "saved").string();
      const PlanReport plan = plan_training(resolve_run(c));
      const TrainSummary s = train(c);
      SCOPED_TRACE(fmt::format("{} {}", model, precision));
      const size_t staging = plan.peak_bytes - without.peak_bytes;
      if (std::string(model) == "gpt2-tiny")
        EXPECT_GT(staging, size_t{1} << 20);  // the transposes' band
      else
        EXPECT_EQ(staging, 0u);  // nothing stored transposed
      EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
      for (Category cat : kAllCategories)
        EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                  s.peak_by_category[static_cast<size_t>(cat)])
            << category_name(cat);
    }
}

// Chat data (loss-mask shards beside the token shards, docs/data.md "Loss masks"): the loaders'
// (B, T) u8 masks are staging the plan counts, train and val, with and without shuffle; the
// masked loss is finite and the step's mean over the masked-in targets.
TEST_F(Planner, PredictedPeakEqualsMeasuredPeakWithLossMasks) {
  const fs::path masked = dir / "masked";
  fs::create_directories(masked);
  for (const char* split : {"train", "val"}) {
    const fs::path from = dir / fmt::format("{}_000000.bin", split);
    fs::copy_file(from, masked / from.filename(), fs::copy_options::overwrite_existing);
    std::vector<uint8_t> m(static_cast<size_t>(io::read_token_shard_header(from)));
    for (size_t i = 0; i < m.size(); ++i) m[i] = (i / 7) % 3 != 0;  // runs of 7: 1/3 out
    io::write_loss_mask(io::loss_mask_path(masked / from.filename()), m);
  }
  for (const char* precision : {"fp32", "bf16"})
    for (bool shuffle : {false, true})
      for (int batch : {1, 3}) {
        TrainConfig c;
        c.model = "gpt2-tiny";
        c.n_layer = 2;
        c.seq_len = 40;
        c.data_dir = masked.string();
        c.batch = batch;
        c.grad_accum = 2;
        c.steps = 2;
        c.eval_batches = 2;
        c.shuffle = shuffle;
        c.precision = precision;
        const PlanReport plan = plan_training(resolve_run(c));
        const TrainSummary s = train(c);
        SCOPED_TRACE(fmt::format("{}, shuffle {}, batch {}", precision, shuffle, batch));
        EXPECT_TRUE(plan.data_included);
        EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
        for (Category cat : kAllCategories)
          EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                    s.peak_by_category[static_cast<size_t>(cat)])
              << category_name(cat);
        // The masks are in the plan: two (B, T) u8 buffers more than the same run unmasked.
        c.data_dir = dir.string();
        const PlanReport unmasked = plan_training(resolve_run(c));
        EXPECT_EQ(plan.peak_bytes - unmasked.peak_bytes,
                  2 * MemoryPool::round_up(static_cast<size_t>(batch) * 40));
        ASSERT_EQ(s.losses.size(), 2u);
        EXPECT_TRUE(std::isfinite(s.losses[0]) && s.losses[0] > 0);
        EXPECT_TRUE(std::isfinite(s.last_val_loss) && s.last_val_loss > 0);
      }
}

TEST_F(Planner, PredictedPeakEqualsMeasuredPeakAtTheRunsThreadCount) {
  // The attention workspaces hold one slice per thread, so the plan must use --threads as the
  // run does: with --threads 1 and with the default (all cores), in both attention kinds.
  const int all = omp_get_max_threads();
  for (int threads : {0, 1})
    for (const char* attention : {"flash", "plain"}) {
      TrainConfig c;
      c.model = "gpt2-tiny";
      c.n_layer = 4;
      c.d_model = 256;
      c.n_head = 4;
      c.seq_len = 64;
      c.batch = 4;
      c.data_dir = dir.string();
      c.steps = 1;
      c.eval_batches = 1;
      c.threads = threads;
      c.attention = attention;
      const PlanReport plan = plan_training(resolve_run(c));
      EXPECT_EQ(omp_get_max_threads(), all) << "plan_training leaked its thread count";
      const TrainSummary s = train(c);
      EXPECT_EQ(omp_get_max_threads(), all) << "train() leaked its thread count";
      SCOPED_TRACE(fmt::format("--threads {} (of {}), {}", threads, all, attention));
      EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
      for (Category cat : kAllCategories)
        EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                  s.peak_by_category[static_cast<size_t>(cat)])
            << category_name(cat);
    }
}

TEST_F(Planner, PredictedPeakEqualsMeasuredPeakWithALargerHeadGroup) {
  // --lm-head-group gathers more rows of the head's bf16 gradient (ws.dlogits) where oneDNN
  // multiplies bf16: the run takes the plan's buffer, and the plan's peak is the run's byte
  // for byte. Where the gradient is not grouped (fp32; bf16 widened under an AVX2 cap) there
  // is no such buffer.
  int64_t dlogits_rows[2][2] = {};
  for (int bf16 : {0, 1})
    for (int group : {0, 768}) {
      TrainConfig c;
      c.model = "gpt2-tiny";
      c.n_layer = 2;
      c.seq_len = 48;
      c.batch = 16;  // 768 rows: the default group is 512
      c.data_dir = dir.string();
      c.steps = 1;
      c.eval_batches = 1;
      c.precision = bf16 ? "bf16" : "fp32";
      c.lm_head_group = group;
      const PlanReport plan = plan_training(resolve_run(c));
      const TrainSummary s = train(c);
      SCOPED_TRACE(fmt::format("{}, --lm-head-group {}", c.precision, group));
      EXPECT_EQ(plan.peak_bytes, s.peak_bytes);
      for (Category cat : kAllCategories)
        EXPECT_EQ(plan.by_category[static_cast<size_t>(cat)],
                  s.peak_by_category[static_cast<size_t>(cat)])
            << category_name(cat);
      for (const BufferSpec& b : plan.step.buffers)
        if (b.tag == "ws.dlogits") dlogits_rows[bf16][group ? 1 : 0] = b.shape[0];
    }
  EXPECT_EQ(dlogits_rows[0][0] + dlogits_rows[0][1], 0);
  if (kernels::matmul_widens(DType::bf16)) {
    EXPECT_EQ(dlogits_rows[1][0] + dlogits_rows[1][1], 0);
  } else {
    EXPECT_EQ(dlogits_rows[1][0], kLmHeadGradRows);
    EXPECT_EQ(dlogits_rows[1][1], 768);
  }
}

TEST_F(Planner, PeakPhaseIsWhereTheMostBytesAreLive) {
  auto plan = [&](const char* precision, const char* ckpt) {
    TrainConfig c;
    c.model = "gpt2";
    c.seq_len = 256;
    c.batch = 8;
    c.data_dir = dir.string();
    c.precision = precision;
    c.ckpt = ckpt;
    return plan_training(resolve_run(c));
  };
  for (const PlanReport& r : {plan("fp32", "full"), plan("bf16", "none")}) {
    ASSERT_EQ(r.step.live.size(), r.step.phases.size());
    size_t most = 0;
    for (const PhaseBytes& live : r.step.live) most = std::max(most, live.total());
    const size_t arenas = r.by_category[static_cast<size_t>(Category::activations)] +
                          r.by_category[static_cast<size_t>(Category::workspace)];
    EXPECT_EQ(r.peak_live_bytes, r.peak_bytes - arenas + most);
    EXPECT_LE(r.peak_live_bytes, r.peak_bytes);
    // (One process: the gradient slab lies in the activations arena, Note [Gradients by
    // lifetime].)
    EXPECT_TRUE(r.step.options.grads_in_arena);
    EXPECT_LT(arenas, plan_bytes(r.step.buffers, Category::activations) +
                          plan_bytes(r.step.buffers, Category::workspace) +
                          plan_bytes(r.step.buffers, Category::grads));
  }
  // Under full checkpointing, the backward of block 0, the step's last: every gradient is born
  // by then, beside the recomputed block and the backward's scratch. Without it in bf16 on oneDNN's bf16 GEMM,
  // the LM head: every activation is still live, and the head's f32 logits chunk is the
  // largest scratch of the step. Where bf16 matmuls widen (an AVX2-only CPU), the head's chunk
  // is 128 rows and the blocks' widening scratch is the largest: the top block's backward.
  EXPECT_EQ(plan("fp32", "full").peak_phase, "backward of block 0");
  EXPECT_EQ(plan("bf16", "none").peak_phase,
            kernels::matmul_widens(DType::bf16) ? "backward of block 11" : "LM head");
}

TEST(PlanConfig, RefusesWhatTrainRefuses) {
  TrainConfig pure_lion;
  pure_lion.precision = "bf16";
  pure_lion.master_weights = "none";
  pure_lion.optim.name = "lion";
  EXPECT_THROW(plan_training(resolve_run(pure_lion)), ConfigError);
  TrainConfig fp16_flash;
  fp16_flash.precision = "fp16";  // flash is the default attention
  EXPECT_THROW(plan_training(resolve_run(fp16_flash)), ConfigError);
  TrainConfig no_batch;
  no_batch.batch = 0;
  EXPECT_THROW(plan_training(resolve_run(no_batch)), ConfigError);
  TrainConfig negative_group;
  negative_group.lm_head_group = -1;
  EXPECT_THROW(plan_training(resolve_run(negative_group)), ConfigError);
}

// --update-in-backward with global clipping runs the micro-batch twice (a measuring backward,
// then the stepping one: Note [Update in backward], "Clipping"): the plan's step time is the
// one-pass estimate plus one more forward and backward and one more zeroing of the unit
// buffers (the update once), its FLOPs twice the pass's; --clip 0 and --clip-mode unit take one
// pass, and so does the ordinary step with any clip, whose zero_grad writes as many bytes as
// one pass's zeroing. Plan only (the trainer's count of passes is UnitSteps::passes, which the
// plan asks).
TEST_F(Planner, GlobalClippingInTheBackwardPricesASecondPass) {
  auto compute = [](const StepTime& t) {
    return t.block_gemm + t.attention + t.head_gemm + t.elementwise + t.compression;
  };
  for (const char* model : {"gpt2-tiny", "llama-tiny"})
    for (const char* ckpt : {"none", "every:2"}) {
      SCOPED_TRACE(fmt::format("{} --ckpt {}", model, ckpt));
      TrainConfig c;
      c.model = model;
      c.n_layer = 2;
      c.seq_len = 32;
      c.batch = 2;
      c.ckpt = ckpt;
      c.data_dir = dir.string();
      c.steps = 1;
      c.update_in_backward = true;
      c.clip = 0;
      const RunSpec off = resolve_run(c);
      EXPECT_EQ(off.backward_passes(), 1);
      const PlanReport one = plan_training(off);
      c.clip = 1.0f;  // the default mode: global
      const RunSpec global = resolve_run(c);
      EXPECT_EQ(global.backward_passes(), 2);
      const PlanReport two = plan_training(global);
      ASSERT_GT(compute(one.step_time), 0);
      EXPECT_DOUBLE_EQ(compute(two.step_time), 2 * compute(one.step_time));
      const double zeroing = 4.0 * double(ParamLayout(one.model).total()) /
                             machine_calibration().stream_bytes_per_s;
      EXPECT_DOUBLE_EQ(two.step_time.optimizer, one.step_time.optimizer + zeroing);
      EXPECT_DOUBLE_EQ(two.est_step_seconds,
                       one.est_step_seconds + compute(one.step_time) + zeroing);
      EXPECT_DOUBLE_EQ(two.flops, 2 * one.flops);
      EXPECT_DOUBLE_EQ(two.recompute_flops, 2 * one.recompute_flops);
      EXPECT_EQ(two.peak_bytes, one.peak_bytes);  // the passes follow each other
      c.clip_mode = "unit";
      EXPECT_DOUBLE_EQ(plan_training(resolve_run(c)).est_step_seconds, one.est_step_seconds);
      c.clip_mode = "global";
      c.update_in_backward = false;
      const RunSpec ordinary = resolve_run(c);
      EXPECT_EQ(ordinary.backward_passes(), 1);
      c.clip = 0;
      EXPECT_DOUBLE_EQ(plan_training(ordinary).step_time.block_gemm,
                       plan_training(resolve_run(c)).step_time.block_gemm);
      EXPECT_DOUBLE_EQ(plan_training(resolve_run(c)).step_time.optimizer,
                       one.step_time.optimizer);
    }
}

TEST(StepFlops, RecomputationAddsOneForwardPerRecomputedBlock) {
  ModelConfig c = ModelConfig::preset("gpt2");
  ActivationOptions none, full, sel, plain_sel;
  full.ckpt = CheckpointPolicy::parse("full");
  sel.ckpt = CheckpointPolicy::parse("selective");
  plain_sel.ckpt = sel.ckpt;
  plain_sel.attention = AttentionKind::plain;
  const StepFlops n = step_flops(c, 8, 256, none), f = step_flops(c, 8, 256, full);
  EXPECT_EQ(n.recompute, 0);
  const double block_fwd = 2.0 * 8 * 256 * 12.0 * c.d_model * c.d_model +
                           2.0 * 8 * 256.0 * 256 * c.d_model;
  EXPECT_DOUBLE_EQ(f.recompute, c.n_layer * block_fwd);
  EXPECT_DOUBLE_EQ(f.total, n.total + f.recompute);
  EXPECT_EQ(step_flops(c, 8, 256, sel).recompute, 0);  // flash recomputes scores anyway
  EXPECT_GT(step_flops(c, 8, 256, plain_sel).recompute, 0);
  // about 6 flops per parameter per token for the matmuls
  EXPECT_NEAR(n.total / (8 * 256) / (6.0 * c.num_params()), 1.0, 0.15);
}

// LoRA's frozen base: each matmul's backward is d(input) alone, so a block's matmuls and the
// head cost 2 forwards, not 3; the scores (attention has no weights) are unchanged.
TEST(StepFlops, LoraHasNoWeightGradientGemms) {
  ModelConfig c = ModelConfig::preset("gpt2");
  ActivationOptions full, lora;
  lora.lora_rank = 16;
  const StepFlops f = step_flops(c, 8, 256, full), l = step_flops(c, 8, 256, lora);
  const double N = 8.0 * 256;
  const double block_matmul = 2.0 * N * double(c.block_matmul_params());
  const double head = 2.0 * N * c.d_model * c.padded_vocab;
  EXPECT_DOUBLE_EQ(f.head, 3 * head);
  EXPECT_DOUBLE_EQ(l.head, 2 * head);
  EXPECT_DOUBLE_EQ(f.total - l.total, c.n_layer * block_matmul + head);
  EXPECT_EQ(l.recompute, 0);
}

}  // namespace
}  // namespace memfit
