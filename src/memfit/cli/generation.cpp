#include "memfit/cli/generation.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

namespace memfit::cli {

namespace {

class WindowLogits final : public NextLogits {
 public:
  WindowLogits(Transformer& model, MemoryPool& pool) : model_(model) {
    const ModelConfig& c = model.config();
    T_ = c.max_seq_len;
    V_ = c.vocab_size;
    // A forward alone: no activations kept for a backward, no gradient slab.
    ActivationOptions act;
    act.inference = true;
    if (model.precision().precision == Precision::fp16)
      act.attention = AttentionKind::plain;  // flash: fp32, bf16
    model.reserve(1, T_, act);
    window_ = Tensor::empty(pool, {1, T_}, DType::i32, Category::staging, "sample.tokens");
    logits_ = Tensor::empty(pool, {1, T_, V_}, DType::f32, Category::workspace, "sample.logits");
  }
  // One window of the model's context: positions past the text are padding, which causal
  // attention keeps from affecting the positions before them.
  std::span<const float> next(const std::vector<int32_t>& ids) override {
    const size_t len = std::min<size_t>(ids.size(), static_cast<size_t>(T_));
    window_.zero();
    std::copy(ids.end() - static_cast<std::ptrdiff_t>(len), ids.end(), window_.data<int32_t>());
    model_.logits(window_, logits_);
    return {logits_.data<float>() + (len - 1) * V_, static_cast<size_t>(V_)};
  }

 private:
  Transformer& model_;
  int T_ = 0, V_ = 0;
  Tensor window_, logits_;
};

class CachedLogits final : public NextLogits {
 public:
  CachedLogits(Transformer& model, MemoryPool& pool, const KvPlan& plan)
      : weights_(model.layout().views(model.params())),
        decoder_(model.config(), model.precision().precision, weights_, pool, plan) {}
  std::span<const float> next(const std::vector<int32_t>& ids) override {
    if (ids.size() > static_cast<size_t>(decoder_.context())) return {};
    const size_t fed = static_cast<size_t>(decoder_.position());
    return decoder_.append({ids.data() + fed, ids.size() - fed});
  }

 private:
  ModelWeights weights_;
  KvDecoder decoder_;
};

}  // namespace

std::unique_ptr<NextLogits> window_logits(Transformer& model, MemoryPool& pool) {
  return std::make_unique<WindowLogits>(model, pool);
}

std::unique_ptr<NextLogits> cached_logits(Transformer& model, MemoryPool& pool,
                                          const KvPlan& plan) {
  MEMFIT_CHECK(!model.params_sharded() && !model.params_offloaded(), "sample",
               "the KV cache reads the working weights whole in RAM");
  return std::make_unique<CachedLogits>(model, pool, plan);
}

TokenChooser::TokenChooser(const SamplingOptions& options, int choices, uint64_t seed)
    : o_(options), choices_(choices), rng_(seed), p_(static_cast<size_t>(choices)),
      order_(static_cast<size_t>(choices)) {}

int32_t TokenChooser::choose(std::span<const float> logits) {
  const float* row = logits.data();
  if (o_.temperature == 0)
    return static_cast<int32_t>(std::max_element(row, row + choices_) - row);
  std::iota(order_.begin(), order_.end(), 0);
  int k = o_.top_k > 0 ? std::min(o_.top_k, choices_) : choices_;
  std::partial_sort(order_.begin(), order_.begin() + k, order_.end(),
                    [row](int32_t a, int32_t b) { return row[a] > row[b]; });
  double z = 0;
  for (int i = 0; i < k; ++i)
    z += p_[i] = std::exp((row[order_[i]] - row[order_[0]]) / o_.temperature);
  if (o_.top_p < 1) {
    // The nucleus: the fewest likeliest tokens whose probabilities sum to at least top_p.
    double kept = 0;
    int m = 0;
    while (m < k && kept < o_.top_p * z) kept += p_[m++];
    k = std::max(m, 1);
    z = kept;
  }
  double u = std::uniform_real_distribution<double>(0, z)(rng_);
  int i = 0;
  while (i < k - 1 && (u -= p_[i]) > 0) ++i;
  return order_[i];
}

void StopStream::show(size_t upto) {
  if (upto <= shown_) return;
  std::fwrite(text_.data() + shown_, 1, upto - shown_, out_);
  std::fflush(out_);
  shown_ = upto;
}

bool StopStream::add(const std::string& piece) {
  text_ += piece;
  size_t hold = 0;
  for (const std::string& s : stops_) {
    if (text_.ends_with(s)) {
      show(text_.size() - s.size());
      return true;
    }
    // The longest end of the text that begins s.
    for (size_t k = std::min(s.size() - 1, text_.size()); k > hold; --k)
      if (text_.compare(text_.size() - k, k, s, 0, k) == 0) {
        hold = k;
        break;
      }
  }
  show(text_.size() - hold);
  return false;
}

void StopStream::finish() { show(text_.size()); }

Generated generate(NextLogits& source, TokenChooser& chooser, const io::Tokenizer& tok,
                   std::vector<int32_t>& ids, int max_tokens,
                   const std::vector<std::string>& stops, std::FILE* out) {
  using Clock = std::chrono::steady_clock;
  Generated g;
  StopStream stream(stops, out);
  const auto start = Clock::now();
  auto first = start;
  for (int n = 0; n < max_tokens; ++n) {
    std::span<const float> logits = source.next(ids);
    if (logits.empty()) {
      g.context_full = true;
      break;
    }
    const int32_t next = chooser.choose(logits);
    ids.push_back(next);
    ++g.tokens;
    if (n == 0) first = Clock::now();
    if (stream.add(tok.decode(std::span<const int32_t>(&next, 1)))) {
      g.stopped = true;
      break;
    }
  }
  if (!g.stopped) stream.finish();
  const auto end = Clock::now();
  g.first_s = std::chrono::duration<double>(first - start).count();
  g.rest_s = std::chrono::duration<double>(end - first).count();
  return g;
}

}  // namespace memfit::cli
