// What `memfit sample` generates with, apart from its options: where the next token's logits
// come from (the KV cache's decoder, or today's forward over the whole window), how a token is
// chosen from them (temperature, top-k, top-p), and the loop that streams the text to the
// terminal a token at a time and stops at a stop text. Note [KV cache] in docs/notes/kv-cache.md.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "memfit/io/tokenizer/tokenizer.h"
#include "memfit/memory/pool.h"
#include "memfit/model/kv_decoder.h"
#include "memfit/model/transformer.h"

namespace memfit::cli {

// The logits of the token after ids (which only ever grow between calls), f32 over the
// vocabulary; empty when the source cannot see past its context (the cache is full).
class NextLogits {
 public:
  virtual ~NextLogits() = default;
  virtual std::span<const float> next(const std::vector<int32_t>& ids) = 0;
};

// --no-kv-cache, what sample did before the cache: a forward over one window of the model's
// context for every token (the last max_seq_len ids, padded after them), sliding past it.
// Reserves the model's inference plan (Note [Inference plan]).
std::unique_ptr<NextLogits> window_logits(Transformer& model, MemoryPool& pool);
// The cache: feeds the ids it has not seen yet (a prompt in steps of plan.rows, then one at a
// time); empty past the context.
std::unique_ptr<NextLogits> cached_logits(Transformer& model, MemoryPool& pool,
                                          const KvPlan& plan);

struct SamplingOptions {
  float temperature = 0.8f;  // 0: greedy
  int top_k = 40;            // 0: every token
  float top_p = 1.0f;        // nucleus: the likeliest tokens whose probabilities reach p
};

// Chooses among the first `choices` ids (the tokenizer's; a wider model's rest have no text):
// the top-k by logit, their probabilities at the temperature, then the smallest prefix of them
// whose probability reaches top_p, sampled. With top_p 1 the draws are those sample made before
// --top-p existed, so a seed gives the same text.
class TokenChooser {
 public:
  TokenChooser(const SamplingOptions& options, int choices, uint64_t seed);
  int32_t choose(std::span<const float> logits);

 private:
  SamplingOptions o_;
  int choices_;
  std::mt19937_64 rng_;
  std::vector<double> p_;
  std::vector<int32_t> order_;
};

// Prints generated text as it comes, holding back what could be the start of a stop text; a
// stop text itself is not printed.
class StopStream {
 public:
  StopStream(std::vector<std::string> stops, std::FILE* out) : stops_(std::move(stops)), out_(out) {}
  // Adds a token's text and prints what can no longer be part of a stop text (flushed). True
  // when the text generated so far ends with a stop text.
  bool add(const std::string& piece);
  void finish();  // prints what was held back
  const std::string& text() const { return text_; }

 private:
  void show(size_t upto);
  std::vector<std::string> stops_;
  std::FILE* out_;
  std::string text_;
  size_t shown_ = 0;
};

struct Generated {
  int tokens = 0;             // tokens generated
  bool stopped = false;       // a stop text ended the text
  bool context_full = false;  // the cache was full before max_tokens
  double first_s = 0;         // seconds to the first token (the prompt's prefill)
  double rest_s = 0;          // seconds for the tokens after it
};

// Appends up to max_tokens tokens to ids, printing each one's text to `out` as it comes.
Generated generate(NextLogits& source, TokenChooser& chooser, const io::Tokenizer& tok,
                   std::vector<int32_t>& ids, int max_tokens,
                   const std::vector<std::string>& stops, std::FILE* out);

}  // namespace memfit::cli
