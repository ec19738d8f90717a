#include "memfit/plan/memory_plan.h"

#include "memfit/io/data_loader.h"
#include "memfit/memory/pool.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/optimizer.h"
#include "memfit/train/trainer.h"

namespace memfit {

StepFlops step_flops(const GPT2Config& c, int B, int T, const ActivationOptions& options) {
  const double N = double(B) * T, C = c.d_model;
  const double block_matmul = 2.0 * N * 12.0 * C * C;  // qkv 3C^2, proj C^2, fc 4C^2, proj 4C^2
  const double scores = 2.0 * double(B) * T * T * C;   // QK^T and PV, causal half, per block
  const double head = 2.0 * N * C * c.padded_vocab;
  // Backward costs twice the forward; flash attention's backward also recomputes the scores.
  const bool flash = options.attention == AttentionKind::flash;
  const double block = 3.0 * block_matmul + (flash ? 4.0 : 3.0) * scores;
  StepFlops f;
  f.total = c.n_layer * block + 3.0 * head;
  const BlockSlots slots = block_slots(options.ckpt, c.n_layer);
  for (int s : slots.slot)
    if (s >= 0) f.recompute += block_matmul + scores;  // the block's forward again
  if (options.ckpt.selective() && !flash) f.recompute += c.n_layer * scores;
  f.total += f.recompute;
  return f;
}

namespace {

// Whole-step rates measured on this machine (2 Sapphire Rapids cores) by
// bench/e2e/precision_vs_pytorch.py on 2026-11-22 (docs/benchmarks.md, "Mixed precision"):
// bf16 0.79-0.86, fp32 0.21-0.27, fp16 0.22-0.25 TFLOP/s at 6x384 and gpt2, 8 x 256. The
// lower ends: an estimate to rank configurations, not a promise.
double step_rate(Precision p) {
  switch (p) {
    case Precision::bf16: return 0.79e12;
    case Precision::fp16: return 0.22e12;  // f16 matmuls widened through the f32 GEMM
    default: return 0.21e12;
  }
}

}  // namespace

PlanReport plan_training(const TrainConfig& cfg) {
  validate_train_config(cfg);
  PlanReport r;
  const RunModel run = resolve_run_model(cfg);
  r.model = run.config;
  r.model.finalize();
  r.T = run.T;
  r.B = cfg.batch;
  const PrecisionOptions precision = cfg.precision_options();
  const ActivationOptions act = cfg.activation_options();

  const ParamLayout layout(r.model);
  auto slab = [&](DType dt) {
    return MemoryPool::round_up(static_cast<size_t>(layout.total()) * dtype_size(dt));
  };
  auto at = [&](Category c) -> size_t& { return r.by_category[static_cast<size_t>(c)]; };
  at(Category::params) = slab(half_dtype(precision.precision));
  if (precision.precision != Precision::fp32 && precision.master_weights)
    at(Category::master) = slab(DType::f32);
  at(Category::grads) = slab(DType::f32);
  OptimConfig oc = cfg.optim;
  oc.n_head = r.model.n_head;
  at(Category::optimizer) = optimizer_state_bytes(oc, layout);
  r.step = gpt2_step_plan(r.model, r.B, r.T, act);
  for (Category c : {Category::activations, Category::workspace})
    at(c) = r.step.arena[static_cast<size_t>(c)];

  const auto train_shards = io::find_token_shards(cfg.data_dir, "train");
  if (cfg.steps > 0 && !train_shards.empty()) {
    io::DataLoaderOptions d;
    d.batch_size = r.B;
    d.seq_len = r.T;
    d.shuffle = cfg.shuffle;
    at(Category::staging) =
        io::DataLoader::staging_bytes(train_shards, d);
    if (auto val = io::find_token_shards(cfg.data_dir, "val"); !val.empty()) {
      d.shuffle = false;
      at(Category::staging) += io::DataLoader::staging_bytes(val, d);
    }
    r.data_included = true;
  }
  for (size_t b : r.by_category) r.peak_bytes += b;
  const int peak = r.step.peak_phase();
  r.peak_phase = r.step.phases[peak].name();
  r.peak_live_bytes = r.peak_bytes - at(Category::activations) - at(Category::workspace) +
                      r.step.live[peak].total();

  const StepFlops f = step_flops(r.model, r.B, r.T, act);
  r.flops = f.total * cfg.grad_accum;
  r.recompute_flops = f.recompute * cfg.grad_accum;
  r.est_step_seconds = r.flops / step_rate(precision.precision);
  return r;
}

}  // namespace memfit
