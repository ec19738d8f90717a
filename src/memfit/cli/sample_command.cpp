// memfit sample: text from a checkpoint, one token at a time, with temperature, top-k and
// top-p, through a KV cache (Note [KV cache], docs/notes/kv-cache.md) or, with --no-kv-cache, a
// forward over the whole window per token; --chat reads prompts from stdin. A LoRA save is
// sampled as its merged model.
#include <cmath>
#include <filesystem>
#include <iostream>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "memfit/cli/commands.h"
#include "memfit/cli/generation.h"
#include "memfit/io/atomic_file.h"
#include "memfit/io/checkpoint/checkpoint_dir.h"
#include "memfit/io/checkpoint/lora_adapter.h"
#include "memfit/io/checkpoint/model_checkpoint.h"
#include "memfit/io/tokenizer/tokenizer.h"
#include "memfit/model/lora_merge.h"
#include "memfit/model/transformer.h"

namespace memfit::cli {

namespace {

struct SampleOptions {
  std::string checkpoint, prompt = "\n", tokenizer = "auto", precision = "fp32";
  int tokens = 100, top_k = 40;
  float temperature = 0.8f, top_p = 1.0f;
  uint64_t seed = 1337;
  std::vector<std::string> stop;
  bool chat = false, no_kv_cache = false, prompt_given = false;
};

// --chat's template ("plain"): each turn is "User: TEXT\nAssistant:", the reply stops where the
// model starts the next user turn, and the conversation stays in the context (the cache keeps
// it) until the context is full.
constexpr const char* kChatUser = "User: ";
constexpr const char* kChatAssistant = "\nAssistant:";
constexpr const char* kChatStop = "\nUser:";

void check_options(const SampleOptions& o) {
  if (o.tokens < 0) MEMFIT_THROW(ConfigError, "sample", "--tokens must be >= 0, got {}", o.tokens);
  if (!(o.temperature >= 0 && std::isfinite(o.temperature)))
    MEMFIT_THROW(ConfigError, "sample", "--temperature must be a finite number >= 0, got {}",
                 o.temperature);
  if (o.top_k < 0)
    MEMFIT_THROW(ConfigError, "sample", "--top-k must be >= 0 (0: all), got {}", o.top_k);
  if (!(o.top_p > 0 && o.top_p <= 1))
    MEMFIT_THROW(ConfigError, "sample", "--top-p must be in (0, 1] (1: off), got {}", o.top_p);
  for (const std::string& s : o.stop)
    if (s.empty()) MEMFIT_THROW(ConfigError, "sample", "--stop must not be empty");
  if (o.chat && o.prompt_given)
    MEMFIT_THROW(ConfigError, "sample",
                 "--chat reads its prompts from stdin, one a line; --prompt is for one text");
}

// A LoRA save (its base weights and PEFT's adapter files) is sampled as the merged model: each
// adapted weight becomes W + (alpha/r) B A once, at load (model/lora_merge.h), so sampling runs
// the plain model at its speed. Exact up to the merge's rounding (one per weight: f32, or bf16
// with --precision bf16), which is what `memfit export --merge-lora` writes too.
void merge_lora(const std::filesystem::path& dir, const ModelConfig& mc, Transformer& gpt,
                MemoryPool& pool) {
  const LoraLayout lora(mc, io::read_lora_options(dir, mc));
  Tensor adapters = Tensor::empty(pool, {lora.total()}, DType::f32, Category::staging,
                                  "sample.lora");
  io::load_lora_adapter(dir, mc, lora, adapters);
  const int merged = lora_merge(mc, gpt.layout(), gpt.weights(), lora, adapters);
  fmt::print(stderr, "[sample] {}: {} LoRA adapters (rank {}, alpha {}) merged into the weights\n",
             dir.string(), merged, lora.options().rank, lora.options().alpha);
}

void run_sample(const SampleOptions& o) {
  check_options(o);
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
  if (po.precision == Precision::fp8)  // Note [FP8], "What is built"
    MEMFIT_THROW(ConfigError, "sample",
                 "--precision fp8 is not built for sampling: the KV-cache decoder's linears have no "
                 "FP8 path; sample an fp8-trained checkpoint with --precision bf16");
  po.master_weights = po.precision != Precision::bf16;
  MemoryPool pool;
  Transformer gpt(mc, pool, po);
  io::load_checkpoint(io::ReadCheckpoint{loc.dir, mc}, mc, gpt.layout(), gpt.weights());
  if (io::has_lora_adapter(loc.dir)) merge_lora(loc.dir, mc, gpt, pool);
  gpt.refresh_working();
  const int V = mc.vocab_size;
  // Ids past the tokenizer's vocabulary (a model wider than its data's tokenizer) have no text:
  // the choice is among the tokenizer's.
  const int choices = std::min(V, tok->vocab_size());
  // What sampling adds to the weights: from here, the pool's peak less the weights (the
  // checkpoint's staging during the load is past).
  const size_t weights = pool.bytes_current();
  pool.reset_peak();
  std::unique_ptr<NextLogits> source;
  KvPlan plan;
  if (o.no_kv_cache) {
    source = window_logits(gpt, pool);
  } else {
    // The inference plan first: what the cache and a step's scratch will take.
    plan = plan_kv_decode(mc, po.precision);
    fmt::print(stderr, "[sample] inference plan: {}\n", plan.describe(mc));
    source = cached_logits(gpt, pool, plan);
  }
  TokenChooser chooser({o.temperature, o.top_k, o.top_p}, choices, o.seed);
  const std::string past_context = fmt::format(
      "[sample] the context of {} tokens is full: stopping (--no-kv-cache slides a window over "
      "the last {} instead)\n",
      mc.max_seq_len, mc.max_seq_len);

  if (o.chat) {
    std::vector<std::string> stops = o.stop;
    stops.push_back(kChatStop);
    std::vector<int32_t> ids;
    std::string line;
    for (bool first = true;; first = false) {
      fmt::print(stderr, "> ");
      std::fflush(stderr);
      if (!std::getline(std::cin, line)) break;
      tok->encode_append(fmt::format("{}{}{}{}", first ? "" : "\n", kChatUser, line,
                                     kChatAssistant),
                         ids);
      const Generated g = generate(*source, chooser, *tok, ids, o.tokens, stops, stdout);
      fmt::print("\n");
      std::fflush(stdout);
      if (g.context_full) {
        fmt::print(stderr, "{}", past_context);
        break;
      }
    }
    return;
  }

  std::vector<int32_t> ids = tok->encode(o.prompt);
  if (ids.empty()) ids.push_back(tok->eot_token());
  const size_t prompt = ids.size();
  fmt::print("{}", o.prompt);
  std::fflush(stdout);
  const Generated g = generate(*source, chooser, *tok, ids, o.tokens, o.stop, stdout);
  fmt::print("\n");
  std::fflush(stdout);
  if (g.context_full) fmt::print(stderr, "{}", past_context);
  // Tokens per second: the first token's wait includes the prompt's prefill.
  const size_t used = pool.bytes_peak() - weights;
  fmt::print(stderr,
             "[sample] {} tokens ({}): first after {:.3f} s ({} prompt tokens), then {:.1f} "
             "tokens/s; pool peak {} = {} weights + {} bytes{}\n",
             g.tokens, o.no_kv_cache ? "no kv cache" : "kv cache", g.first_s, prompt,
             g.tokens > 1 ? (g.tokens - 1) / std::max(g.rest_s, 1e-9) : 0.0,
             format_mib(pool.bytes_peak()), format_mib(weights), used,
             o.no_kv_cache ? "" : fmt::format(" (planned {} bytes)", plan.total()));
}

}  // namespace

void add_sample_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  auto o = std::make_shared<SampleOptions>();
  cmd->add_option("--checkpoint", o->checkpoint, "Checkpoint directory")->required();
  cmd->add_option_function<std::string>(
         "--prompt",
         [o](const std::string& p) {
           o->prompt = p;
           o->prompt_given = true;
         },
         "Text to continue (default: a newline)");
  cmd->add_option("--tokens", o->tokens, "Tokens to generate")->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "0: greedy")->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "Sample among the k likeliest (0: all)")
      ->capture_default_str();
  cmd->add_option("--top-p", o->top_p,
                  "Sample among the likeliest tokens whose probabilities reach P, in (0, 1] "
                  "(after --top-k and --temperature; 1: off)")
      ->capture_default_str();
  cmd->add_option("--stop", o->stop,
                  "Stop when the generated text ends with TEXT (not printed); repeatable")
      ->allow_extra_args(false);
  cmd->add_flag("--chat", o->chat,
                "Read prompts from stdin, one a line, and reply to each (template: "
                "'User: TEXT\\nAssistant:', the reply ends at '\\nUser:')");
  cmd->add_flag("--no-kv-cache", o->no_kv_cache,
                "Recompute the whole window for every token (the path before the KV cache)");
  cmd->add_option("--seed", o->seed)->capture_default_str()->check(kNonNegative);
  cmd->add_option("--tokenizer", o->tokenizer, "auto | gpt2 | llama2 | llama3 | byte | PATH/tokenizer.json")->capture_default_str();
  cmd->add_option("--precision", o->precision, "fp32 | bf16 | fp16")->capture_default_str();
  cmd->callback([o] { run_sample(*o); });
}

}  // namespace memfit::cli
