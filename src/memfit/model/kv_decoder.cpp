#include "memfit/model/kv_decoder.h"

#include <algorithm>
#include <cstring>

#include "memfit/kernels/cpu/cached_attention.h"
#include "memfit/kernels/cpu/embedding.h"
#include "memfit/kernels/cpu/gelu.h"
#include "memfit/kernels/cpu/layernorm.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/kernels/cpu/residual.h"
#include "memfit/kernels/cpu/rmsnorm.h"
#include "memfit/kernels/cpu/rope.h"
#include "memfit/kernels/cpu/swiglu.h"

namespace memfit {

using namespace kernels;

KvDecoder::KvDecoder(const ModelConfig& config, Precision precision, const ModelWeights& weights,
                     MemoryPool& pool, const KvPlan& plan)
    : config_(config), precision_(precision), w_(weights), plan_(plan),
      cache_(config_, plan_, pool) {
  MEMFIT_CHECK(plan_.context == config_.max_seq_len && plan_.cache_dtype == half_dtype(precision),
               "kv_decoder", "a plan for {} positions in {} for a model of {} in {}",
               plan_.context, dtype_name(plan_.cache_dtype), config_.max_seq_len,
               precision_name(precision));
  MEMFIT_CHECK(w_.tok_emb.defined() && w_.head.defined() &&
                   static_cast<int>(w_.blocks.size()) == config_.n_layer,
               "kv_decoder", "the model's working weights are not whole in RAM");
  scratch_ = Tensor::empty(pool, {static_cast<int64_t>(plan_.scratch_bytes)}, DType::i8,
                           Category::workspace, "kv.scratch");
  switch (config_.family) {
    case Family::gpt2: break;  // learned positions: wpe's rows
    case Family::llama: {      // the rotation of every position, once
      Tensor table = scratch("kv.rope");
      rope_table(table, rope_inv_freq(config_.head_size(), config_.rope_theta,
                                      config_.rope_scaling));
      break;
    }
  }
}

Tensor KvDecoder::scratch(const std::string& tag) const {
  const KvBuffer& b = plan_.buffer(tag);
  return scratch_.view_bytes(b.offset, b.shape, b.dtype);
}

void KvDecoder::linear(Tensor out, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  if (matmul_widens(inp.dtype())) {
    Tensor ws = scratch("kv.widen");
    matmul_forward_widened(out, inp, weight, bias, ws);
  } else {
    matmul_forward(out, inp, weight, bias);
  }
}

std::span<const float> KvDecoder::append(std::span<const int32_t> tokens) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  MEMFIT_CHECK(n >= 1 && position_ + n <= plan_.context, "kv_decoder",
               "{} tokens at position {} past the context of {}", n, position_, plan_.context);
  for (int64_t i = 0; i < n; ++i)
    MEMFIT_CHECK(tokens[i] >= 0 && tokens[i] < config_.vocab_size, "kv_decoder",
                 "token {} at position {} is outside the vocabulary [0, {})", tokens[i],
                 position_ + i, config_.vocab_size);
  for (int64_t i = 0; i < n; i += plan_.rows) {
    const int64_t rows = std::min<int64_t>(plan_.rows, n - i);
    step(tokens.subspan(i, rows), /*logits=*/i + rows == n);
  }
  return {scratch("kv.logits").data<float>(), static_cast<size_t>(config_.vocab_size)};
}

// One step of S rows, as transformer_step.cpp and the family's block run them for a window,
// row for row: the same kernels, the same types (matmul operands in h, the residual stream and
// statistics in f32). What differs is the attention (the cached keys and values of the earlier
// positions) and the positions (the embedding's and the rotation's rows from position_ on).
void KvDecoder::step(std::span<const int32_t> tokens, bool logits) {
  const int64_t S = static_cast<int64_t>(tokens.size()), C = config_.d_model, P = position_;
  const int64_t hs = config_.head_size(), kvw = int64_t{config_.n_kv_head} * hs;
  const AttentionHeads heads{config_.n_head, config_.n_kv_head};
  const float eps = config_.norm_eps;
  auto rows = [S](Tensor t) { return t.slice(0, S); };
  Tensor ids = scratch("kv.tokens").view(0, {1, S});
  std::copy(tokens.begin(), tokens.end(), ids.data<int32_t>());
  Tensor x = scratch("kv.x").view(0, {1, S, C});
  Tensor norm = rows(scratch("kv.norm")), rstd = rows(scratch("kv.rstd"));
  Tensor qkv = rows(scratch("kv.qkv")), atty = rows(scratch("kv.atty"));
  Tensor proj = rows(scratch("kv.proj")), fc = rows(scratch("kv.fc")), act = rows(scratch("kv.act"));
  Tensor scores = scratch("kv.scores");
  Tensor mean, rope;
  switch (config_.family) {
    case Family::gpt2: {
      mean = rows(scratch("kv.mean"));
      // The learned positions of rows P..P+S-1.
      Tensor wpe = w_.pos_emb.view(P * C, {S, C});
      embedding_forward(x, ids, w_.tok_emb, wpe);
      break;
    }
    case Family::llama: {
      rope = scratch("kv.rope");
      rope = rope.view(P * hs, {S, hs});  // the rotations of positions P..P+S-1
      Tensor none;
      embedding_forward(x, ids, w_.tok_emb, none);
      break;
    }
  }
  Tensor x2 = x.reshape({S, C});
  auto normalize = [&](const Tensor& w, const Tensor& b, Tensor& out, Tensor& inp, Tensor& m,
                       Tensor& r) {
    switch (config_.family) {
      case Family::gpt2: layernorm_forward(out, m, r, inp, w, b); break;
      case Family::llama: rmsnorm_forward(out, r, inp, w, eps); break;
    }
  };
  const size_t es = dtype_size(plan_.cache_dtype);
  for (int l = 0; l < config_.n_layer; ++l) {
    const BlockWeights& w = w_.blocks[static_cast<size_t>(l)];
    normalize(w.norm1_w, w.norm1_b, norm, x2, mean, rstd);
    linear(qkv, norm, w.qkv_w, w.qkv_b);
    switch (config_.family) {
      case Family::gpt2: break;
      case Family::llama: {
        Tensor q3 = qkv.reshape({1, S, config_.qkv_width()});
        rope_forward(q3, rope, heads);
        break;
      }
    }
    // This step's keys and values into the cache at rows P..P+S-1.
    Tensor& kc = cache_.keys(l);
    Tensor& vc = cache_.values(l);
    const auto* src = static_cast<const std::byte*>(qkv.raw_data());
    const int64_t qw = config_.qkv_width(), q_width = config_.attn_width();
    for (int64_t s = 0; s < S; ++s) {
      const std::byte* row = src + s * qw * es;
      std::memcpy(static_cast<std::byte*>(kc.raw_data()) + (P + s) * kvw * es,
                  row + q_width * es, kvw * es);
      std::memcpy(static_cast<std::byte*>(vc.raw_data()) + (P + s) * kvw * es,
                  row + (q_width + kvw) * es, kvw * es);
    }
    cached_attention_forward(atty, qkv, kc, vc, P, heads, scores);
    linear(proj, atty, w.attn_out_w, w.attn_out_b);
    residual_forward(x2, x2, proj);
    normalize(w.norm2_w, w.norm2_b, norm, x2, mean, rstd);
    linear(fc, norm, w.fc_w, w.fc_b);
    switch (config_.family) {
      case Family::gpt2: gelu_forward(act, fc); break;
      case Family::llama: swiglu_forward(act, fc); break;
    }
    linear(proj, act, w.mlp_out_w, w.mlp_out_b);
    residual_forward(x2, x2, proj);
  }
  position_ += static_cast<int>(S);
  if (!logits) return;
  // The final norm and the head, of the last row alone.
  Tensor last = x2.slice(S - 1, S), n1 = norm.slice(0, 1), r1 = rstd.slice(0, 1);
  Tensor m1 = mean.defined() ? mean.slice(0, 1) : Tensor{};
  normalize(w_.norm_w, w_.norm_b, n1, last, m1, r1);
  Tensor out = scratch("kv.logits");
  if (matmul_widens(n1.dtype())) {
    Tensor ws = scratch("kv.widen.head");
    matmul_forward_widened_blocked(out, n1, w_.head, ws);
  } else {
    Tensor none;
    matmul_forward(out, n1, w_.head, none);
  }
}

}  // namespace memfit
