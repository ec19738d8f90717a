// memfit sample: text from a checkpoint, one token at a time, with temperature and top-k.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <numeric>
#include <random>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "memfit/cli/commands.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint_dir.h"
#include "memfit/io/model_checkpoint.h"
#include "memfit/io/tokenizer.h"
#include "memfit/model/transformer.h"

namespace memfit::cli {

namespace {

struct SampleOptions {
  std::string checkpoint, prompt = "\n", tokenizer = "auto", precision = "fp32";
  int tokens = 100, top_k = 40;
  float temperature = 0.8f;
  uint64_t seed = 1337;
};

void run_sample(const SampleOptions& o) {
  if (o.tokens < 0) MEMFIT_THROW(ConfigError, "sample", "--tokens must be >= 0, got {}", o.tokens);
  if (!(o.temperature >= 0 && std::isfinite(o.temperature)))
    MEMFIT_THROW(ConfigError, "sample", "--temperature must be a finite number >= 0, got {}",
                 o.temperature);
  if (o.top_k < 0)
    MEMFIT_THROW(ConfigError, "sample", "--top-k must be >= 0 (0: all), got {}", o.top_k);
  io::CheckpointLocation loc = io::locate_checkpoint(o.checkpoint);
  ModelConfig mc = io::read_model_config(loc.dir / "config.json");
  // auto: the tokenizer of the data the checkpoint was trained on (its trainer_state.json's,
  // from the data's dataset.json); else, for checkpoints from elsewhere, the largest known one
  // the model's vocabulary holds (Llama 3's 128,256 ids, GPT-2's 50,257, the Mistral-style
  // llama2 package's 32,000, bytes); --tokenizer names any other.
  auto by_vocab = [](int v) -> std::string {
    if (v >= 128256) return "llama3";
    if (v >= 50257) return "gpt2";
    if (v >= 32000) return "llama2";
    return "byte";
  };
  auto trained_with = [&]() -> std::string {
    try {
      const auto s =
          nlohmann::json::parse(io::read_file_to_string(loc.dir / "trainer_state.json"));
      if (s.contains("tokenizer") && s["tokenizer"].is_string())
        return s["tokenizer"].get<std::string>();
    } catch (const std::exception&) {
      // No trainer_state.json (a Hugging Face checkpoint) or an unreadable one: by vocabulary.
    }
    return "";
  };
  std::string tok_name = o.tokenizer;
  if (tok_name == "auto") tok_name = trained_with();
  if (tok_name.empty()) tok_name = by_vocab(mc.vocab_size);
  auto tok = io::make_tokenizer(tok_name);
  if (tok->vocab_size() > mc.vocab_size)
    MEMFIT_THROW(ConfigError, "sample",
                 "the {} tokenizer has {} tokens, the model only {}: name the tokenizer of its "
                 "training data with --tokenizer (gpt2, llama2, llama3, byte or a "
                 "tokenizer.json)",
                 tok_name, tok->vocab_size(), mc.vocab_size);

  // bf16 loads straight into bf16 weights; fp16 keeps f32 weights of record to round from.
  PrecisionOptions po;
  po.precision = precision_from_name(o.precision);
  po.master_weights = po.precision != Precision::bf16;
  MemoryPool pool;
  Transformer gpt(mc, pool, po);
  io::load_checkpoint(loc.dir, mc, gpt.layout(), gpt.weights());
  gpt.refresh_working();
  std::vector<int32_t> ids = tok->encode(o.prompt);
  if (ids.empty()) ids.push_back(tok->eot_token());

  // One window of the model's context: positions past the text are padding, which causal
  // attention keeps from affecting the positions before them.
  const int T = mc.max_seq_len, V = mc.vocab_size;
  // Ids past the tokenizer's vocabulary (a model wider than its data's tokenizer) have no text:
  // the choice is among the tokenizer's.
  const int choices = std::min(V, tok->vocab_size());
  // A forward alone: no activations kept for a backward, no gradient slab.
  ActivationOptions act;
  act.inference = true;
  if (po.precision == Precision::fp16) act.attention = AttentionKind::plain;  // flash: fp32, bf16
  gpt.reserve(1, T, act);
  Tensor window = Tensor::empty(pool, {1, T}, DType::i32, Category::staging, "sample.tokens");
  Tensor logits = Tensor::empty(pool, {1, T, V}, DType::f32, Category::workspace, "sample.logits");
  std::mt19937_64 rng(o.seed);
  std::vector<double> p(V);
  std::vector<int32_t> order(V);
  fmt::print("{}", o.prompt);
  for (int n = 0; n < o.tokens; ++n) {
    const size_t len = std::min<size_t>(ids.size(), T);
    window.zero();
    std::copy(ids.end() - len, ids.end(), window.data<int32_t>());
    gpt.logits(window, logits);
    const float* row = logits.data<float>() + (len - 1) * V;
    int32_t next;
    if (o.temperature == 0) {
      next = static_cast<int32_t>(std::max_element(row, row + choices) - row);
    } else {
      std::iota(order.begin(), order.end(), 0);
      const int k = o.top_k > 0 ? std::min(o.top_k, choices) : choices;
      std::partial_sort(order.begin(), order.begin() + k, order.begin() + choices,
                        [row](int32_t a, int32_t b) { return row[a] > row[b]; });
      double z = 0;
      for (int i = 0; i < k; ++i) z += p[i] = std::exp((row[order[i]] - row[order[0]]) / o.temperature);
      double u = std::uniform_real_distribution<double>(0, z)(rng);
      int i = 0;
      while (i < k - 1 && (u -= p[i]) > 0) ++i;
      next = order[i];
    }
    ids.push_back(next);
    fmt::print("{}", tok->decode(std::span<const int32_t>(&next, 1)));
    std::fflush(stdout);
  }
  fmt::print("\n");
}

}  // namespace

void add_sample_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  auto o = std::make_shared<SampleOptions>();
  cmd->add_option("--checkpoint", o->checkpoint, "Checkpoint directory")->required();
  cmd->add_option("--prompt", o->prompt, "Text to continue")->capture_default_str();
  cmd->add_option("--tokens", o->tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0: greedy")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Sample among the k likeliest (0: all)")
      ->capture_default_str();
  cmd->add_option("--seed", o->seed)->capture_default_str()->check(kNonNegative);
  cmd->add_option("--tokenizer", o->tokenizer, "auto | gpt2 | llama2 | llama3 | byte | PATH/tokenizer.json")->capture_default_str();
  cmd->add_option("--precision", o->precision, "fp32 | bf16 | fp16")->capture_default_str();
  cmd->callback([o] { run_sample(*o); });
}

}  // namespace memfit::cli
