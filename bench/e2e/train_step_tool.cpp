// Times full training steps (forward, backward, optimizer update through the trainer's own
// apply_update) of a GPT-2 or LLaMA shape on random tokens and
// prints one JSON object: per-step milliseconds, median, tokens/s, achieved FLOP/s and the
// pool's peak by category. Driven by bench/e2e/step_vs_pytorch.py, which runs the PyTorch
// baseline beside it; kept out of the test suite because it measures time. --context sets the
// model's context (wpe rows; default the preset's): `memfit train --seq-len T` trains a model
// whose context is T, so bench/e2e/plan_grid.py passes --context T to compare with its plan.
// The shape overrides are memfit train's (--n-layer, --n-head, --n-kv-head, --d-model,
// --ffn-dim, --vocab, --tie-embeddings), applied to the preset by TrainConfig::model_config.
// --kernel-times 1 adds "kernels": the timed steps' time per kernel and per GEMM shape, per
// step (Note [Kernel times]).
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "memfit/cli/options/train_config.h"
#include "memfit/kernels/kernel_times.h"
#include "memfit/model/transformer.h"
#include "memfit/optim/optimizer.h"
#include "memfit/profile/profile_summary.h"
#include "memfit/train/update.h"

using namespace memfit;

int main(int argc, char** argv) {
  std::string model = "gpt2-small-test";
  int B = 8, T = 256, steps = 5, warmup = 1, chunk = 0, group = 0;  // 0: the model's default
  TrainConfig shape;  // the preset and memfit train's overrides of it (0 / empty: keep)
  std::string attention = "flash", precision = "fp32", master = "fp32", optim = "adamw",
              ckpt = "none", act_compress = "none";
  bool kernel_times = false;
  // One process, one micro-batch a step: memfit train keeps the gradients in the activations
  // arena by lifetime (RunSpec::grads_share_arena); 0 gives them their own slab, for comparison.
  bool grads_in_arena = true;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--model") model = v;
    else if (k == "--batch") B = std::stoi(v);
    else if (k == "--seq") T = std::stoi(v);
    else if (k == "--context") shape.seq_len = std::stoi(v);
    else if (k == "--n-layer") shape.n_layer = std::stoi(v);
    else if (k == "--n-head") shape.n_head = std::stoi(v);
    else if (k == "--n-kv-head") shape.n_kv_head = std::stoi(v);
    else if (k == "--d-model") shape.d_model = std::stoi(v);
    else if (k == "--ffn-dim") shape.ffn_dim = std::stoi(v);
    else if (k == "--vocab") shape.vocab = std::stoi(v);
    else if (k == "--tie-embeddings") shape.tie_embeddings = v;
    else if (k == "--steps") steps = std::stoi(v);
    else if (k == "--warmup") warmup = std::stoi(v);
    else if (k == "--lm-head-chunk") chunk = std::stoi(v);
    else if (k == "--lm-head-group") group = std::stoi(v);
    else if (k == "--attention") attention = v;
    else if (k == "--precision") precision = v;
    else if (k == "--master-weights") master = v;
    else if (k == "--optim") optim = v;
    else if (k == "--ckpt") ckpt = v;
    else if (k == "--act-compress") act_compress = v;
    else if (k == "--kernel-times") kernel_times = v == "1";
    else if (k == "--grads-in-arena") grads_in_arena = v == "1";
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    MemoryPool pool;
    shape.model = model;
    const ModelConfig config = shape.model_config();
    PrecisionOptions po{precision_from_name(precision), master != "none"};
    Transformer gpt(config, pool, po);
    gpt.init_weights(1337);
    ActivationOptions opts;
    opts.lm_head_chunk = chunk;
    opts.lm_head_group = group;
    opts.attention = attention_kind_from_name(attention);
    opts.ckpt = CheckpointPolicy::parse(ckpt);
    opts.act_compress = act_compress_from_name(act_compress);
    opts.grads_in_arena = grads_in_arena;
    gpt.reserve(B, T, opts);
    OptimConfig oc;
    oc.name = optim;
    oc.n_head = config.n_head;
    oc.seed = 1337;
    std::unique_ptr<Optimizer> opt = make_optimizer(oc, gpt.layout(), pool);
    std::unique_ptr<DynamicLossScaler> scaler;
    if (po.precision == Precision::fp16) scaler = std::make_unique<DynamicLossScaler>();
    int skipped = 0;

    Tensor tokens = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "bench.tokens");
    Tensor targets = Tensor::empty(pool, {B, T}, DType::i32, Category::staging, "bench.targets");
    std::mt19937 rng(42);
    for (int64_t i = 0; i < tokens.numel(); ++i) {
      tokens.data<int32_t>()[i] = static_cast<int32_t>(rng() % config.vocab_size);
      targets.data<int32_t>()[i] = static_cast<int32_t>(rng() % config.vocab_size);
    }
    std::vector<double> ms;
    std::vector<float> losses;
    for (int s = 0; s < warmup + steps; ++s) {
      if (s == warmup && kernel_times) {
        kernels::reset_kernel_times();
        kernels::record_kernel_times(true);
      }
      auto t0 = std::chrono::steady_clock::now();
      gpt.zero_grad();
      float loss = gpt.forward(tokens, targets, /*training=*/true,
                               scaler ? scaler->scale() : 1.0f);
      gpt.backward();
      UpdateOutcome u = apply_update(gpt, *opt, scaler.get(), 3e-4f, 1.0f, 1);
      skipped += u.skipped;
      auto t1 = std::chrono::steady_clock::now();
      if (s >= warmup) ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      losses.push_back(loss);
    }
    kernels::record_kernel_times(false);
    std::vector<double> sorted = ms;
    std::sort(sorted.begin(), sorted.end());
    // --steps 0 --warmup 0 builds the model, the optimizer and the activation plan and runs
    // nothing: the pool then holds everything a step would use (a step allocates nothing).
    double median = 0;
    if (!sorted.empty()) {
      median = sorted[sorted.size() / 2];
      if (sorted.size() % 2 == 0) median = 0.5 * (sorted[sorted.size() / 2 - 1] + median);
    }
    // FLOPs: 6 x (parameters that multiply: without GPT-2's wpe or an untied LLaMA's token
    // embedding, both looked up; a tied head counted through wte) x tokens for the matmuls, plus
    // the attention scores and mixing: 12 x layers x (query heads x head size) x T per token.
    const double tokens_per_step = double(B) * T;
    const double lookup_rows = config.family == Family::gpt2 ? config.max_seq_len
                               : config.tie_embeddings ? 0 : config.padded_vocab;
    const double n = double(config.num_params()) - lookup_rows * config.d_model;
    const double attention = 12.0 * config.n_layer * double(config.attn_width()) * T;
    const double flops = (6.0 * n + attention) * tokens_per_step;
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    nlohmann::json j;
    j["impl"] = "memfit";
    j["model"] = model;
    j["family"] = std::string(family_name(config.family));
    j["shape"] = config.describe();
    j["attention"] = attention;
    j["precision"] = precision;
    j["master_weights"] = master;
    j["optim"] = optim;
    j["ckpt"] = ckpt;
    j["act_compress"] = act_compress;
    j["lm_head_chunk"] = gpt.step_plan().options.lm_head_chunk;  // as planned
    j["lm_head_group"] = lm_head_grad_rows(gpt.step_plan().options, int64_t{B} * T);
    j["skipped"] = skipped;
    j["batch"] = B;
    j["seq"] = T;
    j["params"] = config.num_params();
    j["step_ms"] = ms;
    j["steps_timed"] = ms.size();
    auto if_timed = [&](double v) { return ms.empty() ? nlohmann::json() : nlohmann::json(v); };
    j["median_ms"] = if_timed(median);
    j["tokens_per_s"] = if_timed(tokens_per_step / (median / 1e3));
    j["flops_per_step"] = flops;
    j["tflops"] = if_timed(flops / (median / 1e3) / 1e12);
    j["losses"] = losses;
    j["peak_rss_bytes"] = static_cast<int64_t>(ru.ru_maxrss) * 1024;
    j["pool_peak_bytes"] = pool.bytes_peak();
    nlohmann::json cats;
    CategoryBytes at_peak = pool.peak_breakdown();
    for (Category c : kAllCategories)
      if (at_peak[static_cast<size_t>(c)]) cats[std::string(category_name(c))] = at_peak[static_cast<size_t>(c)];
    j["pool_peak_by_category"] = cats;
    if (kernel_times && steps > 0)  // per timed step (Note [Kernel times])
      j["kernels"] = profile::kernels_json(kernels::kernel_times(), steps);
    std::printf("%s\n", j.dump().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "train_step_tool: %s\n", e.what());
    return 1;
  }
  return 0;
}
