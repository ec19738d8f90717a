#include "memfit/model/gpt2.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <random>

#include "memfit/kernels/cpu/attention.h"
#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/crossentropy.h"
#include "memfit/kernels/cpu/embedding.h"
#include "memfit/kernels/cpu/flash_attention.h"
#include "memfit/kernels/cpu/gelu.h"
#include "memfit/kernels/cpu/layernorm.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/kernels/cpu/residual.h"

namespace memfit {

using namespace kernels;

GPT2::GPT2(const GPT2Config& config, MemoryPool& pool, const PrecisionOptions& precision)
    : config_(config), pool_(pool), layout_((config_.finalize(), config_)), precision_(precision) {
  check_precision_options(precision);
  const Precision p = precision.precision;
  params_ = Tensor::empty(pool, {layout_.total()}, half_dtype(p), Category::params, "params");
  if (p != Precision::fp32 && precision.master_weights)
    master_ = Tensor::empty(pool, {layout_.total()}, DType::f32, Category::master, "master");
  grads_ = Tensor::empty(pool, {layout_.total()}, DType::f32, Category::grads, "grads");
}

void GPT2::refresh_working() {
  if (master_.defined()) convert(params_, master_);
}

namespace {

// Writes GPT-2's initial weights (see init_weights) into an f32 slab.
void init_gpt2_weights(const GPT2Config& config, const ParamLayout& layout, Tensor& slab,
                       uint64_t seed) {
  // Box-Muller over mt19937_64 rather than std::normal_distribution, whose algorithm differs
  // between standard libraries: the same seed gives the same weights everywhere.
  std::mt19937_64 rng(seed);
  auto uniform = [&] { return (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53; };
  auto normal = [&] {
    return std::sqrt(-2.0 * std::log(uniform())) * std::cos(2.0 * M_PI * uniform());
  };
  slab.zero();
  const double residual_scale = 1.0 / std::sqrt(2.0 * config.n_layer);
  for (const ParamInfo& p : layout.params()) {
    float* w = slab.data<float>() + p.offset;
    switch (p.role) {
      case ParamRole::norm_weight: std::fill(w, w + p.numel, 1.0f); break;
      case ParamRole::norm_bias:
      case ParamRole::linear_bias: break;
      default: {
        double std = 0.02;
        if (p.role == ParamRole::attn_proj_weight || p.role == ParamRole::mlp_proj_weight)
          std *= residual_scale;
        int64_t n = p.numel;
        if (p.role == ParamRole::token_embedding) n = int64_t{config.vocab_size} * p.shape[1];
        for (int64_t i = 0; i < n; ++i) w[i] = static_cast<float>(std * normal());
      }
    }
  }
}

}  // namespace

void GPT2::init_weights(uint64_t seed) {
  Tensor& w = weights();
  if (w.dtype() == DType::f32) {
    init_gpt2_weights(config_, layout_, w, seed);
  } else {
    // Pure bf16: draw in f32 in a staging slab that lives only for this call.
    Tensor staging =
        Tensor::empty(pool_, {layout_.total()}, DType::f32, Category::staging, "init.staging");
    init_gpt2_weights(config_, layout_, staging, seed);
    convert(w, staging);
  }
  refresh_working();
}


void GPT2::mm_forward(Tensor out, const Tensor& inp, const Tensor& weight, const Tensor& bias) {
  if (matmul_widens(inp.dtype())) {
    Tensor scratch = buffer("ws.widen");
    matmul_forward_widened(out, inp, weight, bias, scratch);
  } else {
    matmul_forward(out, inp, weight, bias);
  }
}

void GPT2::mm_backward(Tensor dinp, Tensor dweight, Tensor dbias, const Tensor& dout,
                       const Tensor& inp, const Tensor& weight) {
  if (matmul_widens(inp.dtype())) {
    Tensor scratch = buffer("ws.widen");
    matmul_backward_widened(dinp, dweight, dbias, dout, inp, weight, scratch);
  } else {
    matmul_backward(dinp, dweight, dbias, dout, inp, weight);
  }
}

void GPT2::reserve(int B, int T, const ActivationOptions& options_in) {
  ActivationOptions options = options_in;
  options.precision = precision_.precision;
  MEMFIT_CHECK_SHAPE(B > 0 && T > 0 && T <= config_.max_seq_len, "gpt2",
                     "batch {} x {} tokens does not fit a context of {}", B, T,
                     config_.max_seq_len);
  const ActivationOptions& now = plan_.options;
  if (B == B_ && T == T_ && options.lm_head_chunk == now.lm_head_chunk &&
      options.attention == now.attention && options.ckpt == now.ckpt)
    return;
  reserve(gpt2_step_plan(config_, B, T, options));
}

void GPT2::reserve(StepPlan plan) {
  MEMFIT_CHECK(plan.options.precision == precision_.precision && plan.B > 0 && plan.T > 0 &&
                   plan.T <= config_.max_seq_len,
               "gpt2", "a step plan for {} x {} tokens in {} does not fit this {} model", plan.B,
               plan.T, precision_name(plan.options.precision),
               precision_name(precision_.precision));
  // The old arenas go first, so reserving again never holds two plans at once.
  buffers_.clear();
  index_.clear();
  B_ = T_ = 0;
  std::array<Tensor, kNumCategories> arenas;
  for (Category c : {Category::activations, Category::workspace}) {
    const size_t bytes = plan.arena[static_cast<size_t>(c)];
    if (bytes == 0) continue;
    arenas[static_cast<size_t>(c)] =
        Tensor::empty(pool_, {static_cast<int64_t>(bytes)}, DType::i8, c,
                      fmt::format("{} arena", category_name(c)));
  }
  for (const BufferSpec& b : plan.buffers) {
    index_.emplace(b.tag, buffers_.size());
    buffers_.push_back(
        arenas[static_cast<size_t>(b.category)].view_bytes(b.offset, b.shape, b.dtype));
  }
  slots_ = block_slots(plan.options.ckpt, config_.n_layer);
  B_ = plan.B;
  T_ = plan.T;
  plan_ = std::move(plan);
  phase_ = -1;
  backward_ready_ = false;
}

const Tensor& GPT2::buffer(const std::string& tag) const {
  auto it = index_.find(tag);
  MEMFIT_CHECK(it != index_.end(), "gpt2", "no buffer '{}' (reserve() first)", tag);
  return buffers_[it->second];
}

GPT2::BlockActs GPT2::block_acts(int l) const {
  const BlockTags t = block_tags(slots_, l, plan_.options);
  BlockActs b;
  b.ln1 = buffer(t.ln1), b.ln1_mean = buffer(t.ln1_mean), b.ln1_rstd = buffer(t.ln1_rstd);
  b.qkv = buffer(t.qkv), b.atty = buffer(t.atty), b.r2 = buffer(t.r2);
  b.ln2 = buffer(t.ln2), b.ln2_mean = buffer(t.ln2_mean), b.ln2_rstd = buffer(t.ln2_rstd);
  b.fch = buffer(t.fch), b.r3 = buffer(t.r3);
  if (!t.lse.empty()) b.lse = buffer(t.lse);
  if (!t.att.empty()) b.att = buffer(t.att);
  return b;
}

Tensor GPT2::block_input(int l) const {
  return buffer(block_input_tag(slots_, l, plan_.options));
}

void GPT2::enter(PhaseKind kind, int layer) {
  const Phase phase{kind, layer};
  const auto& phases = plan_.phases;
  int next = 0;
  if (phase_ + 1 < static_cast<int>(phases.size()) && phases[phase_ + 1] == phase)
    next = phase_ + 1;
  else
    MEMFIT_CHECK(phases.front() == phase, "gpt2",
                 "entered '{}' after '{}': the engine left its step schedule (step_schedule.cpp)",
                 phase.name(), phase_ < 0 ? "nothing" : phases[phase_].name());
  if (poison_) poison_edges(next == 0 ? -1 : phase_, next);
  phase_ = next;
}

// Note [Step arena]: the bytes of a buffer between its spans may hold another buffer, and its
// old value is dead when a span opens, so the check makes both visibly garbage: all bits set is
// a NaN in f32, bf16 and f16; token ids become 0 (a valid token, but the wrong one).
void GPT2::poison_edges(int ended, int begins) {
  for (size_t i = 0; i < buffers_.size(); ++i) {
    bool hit = begins == 0;  // a new micro-batch: nothing from before is live
    for (const LiveSpan& s : plan_.buffers[i].lifetime.spans)
      hit = hit || s.last == ended || s.first == begins;
    if (!hit) continue;
    Tensor& t = buffers_[i];
    std::memset(t.raw_data(), t.dtype() == DType::i32 ? 0 : 0xff, t.nbytes());
  }
}

// Plain attention's forward; half-precision operands take the widening workspace.
void GPT2::plain_attention_forward(Tensor out, Tensor att, const Tensor& qkv) {
  if (qkv.dtype() == DType::f32) {
    attention_forward(out, att, qkv, config_.n_head);
  } else {
    Tensor ws = buffer("ws.attention_fwd");
    attention_forward(out, att, qkv, ws, config_.n_head);
  }
}

// One block's forward from its input x into its buffers. ws.dC and ws.gelu serve as scratch for
// the projections' outputs and the GELU: free during forward, and at the start of each block's
// backward, where recomputation calls this again.
void GPT2::forward_block(int l, const Tensor& x, BlockActs& b) {
  auto p = [this, l](const char* what) { return param(fmt::format("h.{}.{}", l, what)); };
  Tensor proj = buffer("ws.dC"), gelu = buffer("ws.gelu");
  layernorm_forward(b.ln1, b.ln1_mean, b.ln1_rstd, x, p("ln_1.weight"), p("ln_1.bias"));
  mm_forward(b.qkv, b.ln1, p("attn.c_attn.weight"), p("attn.c_attn.bias"));
  if (plan_.options.attention == AttentionKind::flash) {
    Tensor ws = buffer("ws.attention_fwd");
    flash_attention_forward(b.atty, b.lse, b.qkv, ws, config_.n_head);
  } else {
    plain_attention_forward(b.atty, b.att, b.qkv);
  }
  mm_forward(proj, b.atty, p("attn.c_proj.weight"), p("attn.c_proj.bias"));
  residual_forward(b.r2, x, proj);
  layernorm_forward(b.ln2, b.ln2_mean, b.ln2_rstd, b.r2, p("ln_2.weight"), p("ln_2.bias"));
  mm_forward(b.fch, b.ln2, p("mlp.c_fc.weight"), p("mlp.c_fc.bias"));
  gelu_forward(gelu, b.fch);
  mm_forward(proj, gelu, p("mlp.c_proj.weight"), p("mlp.c_proj.bias"));
  residual_forward(b.r3, b.r2, proj);
}

void GPT2::forward_blocks(const Tensor& tokens) {
  expect_tensor(tokens, "gpt2", "tokens", {B_, T_}, DType::i32);
  // wte has padded rows, so the embedding alone would accept ids up to padded_vocab.
  const int32_t* ids = tokens.data<int32_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i)
    MEMFIT_CHECK(ids[i] >= 0 && ids[i] < config_.vocab_size, "gpt2",
                 "token {} at position {} is outside the vocabulary [0, {})", ids[i], i,
                 config_.vocab_size);
  enter(PhaseKind::embedding);
  Tensor encoded = buffer("encoded");
  embedding_forward(encoded, tokens, param("wte.weight"), param("wpe.weight"));
  for (int l = 0; l < config_.n_layer; ++l) {
    enter(PhaseKind::forward, l);
    BlockActs b = block_acts(l);
    forward_block(l, block_input(l), b);
  }
  enter(PhaseKind::ln_f);
  Tensor x = block_input(config_.n_layer);
  Tensor lnf = buffer("ln_f"), lnfm = buffer("ln_f.mean"), lnfr = buffer("ln_f.rstd");
  layernorm_forward(lnf, lnfm, lnfr, x, param("ln_f.weight"), param("ln_f.bias"));
}

// Note [Fused LM head]: the logits of a GPT-2 batch are (B*T, V) floats, 412 MB for 8 x 256
// tokens, and their gradient as much again. Instead, rows are taken `lm_head_chunk` at a time:
// logits = ln_f @ wte^T for the chunk, softmax cross-entropy, and (in training) the chunk's
// gradient at once: d(ln_f) rows = dlogits @ wte, d(wte) += dlogits^T @ ln_f. Only one chunk of
// logits ever exists, and the LM head costs no extra matmul.
// In bf16/fp16 the chunk's gradient is rounded into ws.dlogits, the head's matmul operand, while
// the logits, softmax and loss stay f32 (see crossentropy.h).
void GPT2::lm_head(const Tensor& targets, bool training, float dloss, float* loss_sum) {
  enter(PhaseKind::lm_head);
  const int64_t N = int64_t{B_} * T_, C = config_.d_model;
  Tensor lnf = buffer("ln_f").reshape({N, C});
  Tensor logits_ws = buffer("ws.logits"), losses = buffer("ws.losses");
  Tensor dlnf = buffer("ws.dC").reshape({N, C});
  Tensor flat_targets = targets.reshape({N});
  Tensor wte = param("wte.weight"), dwte = grad("wte.weight");
  const int64_t R = logits_ws.size(0);
  const bool mixed = params_.dtype() != DType::f32;
  Tensor dlogits_ws = mixed ? buffer("ws.dlogits") : logits_ws;
  Tensor no_bias;
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t r1 = std::min(N, r0 + R), rows = r1 - r0;
    Tensor x = lnf.slice(r0, r1);
    Tensor logits = logits_ws.slice(0, rows);
    Tensor tgt = flat_targets.slice(r0, r1), loss = losses.slice(r0, r1);
    mm_forward(logits, x, wte, no_bias);
    if (!training) {
      crossentropy_forward(loss, logits, tgt, config_.vocab_size);
      continue;
    }
    Tensor dlogits = dlogits_ws.slice(0, rows);
    if (mixed)
      crossentropy_forward_backward(loss, dlogits, logits, tgt, config_.vocab_size, dloss);
    else
      crossentropy_forward_backward(loss, logits, tgt, config_.vocab_size, dloss);
    mm_backward(dlnf.slice(r0, r1), dwte, no_bias, dlogits, x, wte);
  }
  double sum = 0;
  const float* l = losses.data<float>();
  for (int64_t i = 0; i < N; ++i) sum += l[i];
  *loss_sum = static_cast<float>(sum);
}

float GPT2::forward(const Tensor& tokens, const Tensor& targets, bool training,
                    float loss_scale) {
  MEMFIT_CHECK(B_ > 0, "gpt2", "forward before reserve()");
  expect_tensor(targets, "gpt2", "targets", {B_, T_}, DType::i32);
  forward_blocks(tokens);
  float loss_sum = 0;
  lm_head(targets, training, loss_scale / static_cast<float>(int64_t{B_} * T_), &loss_sum);
  backward_ready_ = training;
  if (training) {
    // backward() needs the tokens for the embedding's gradient; keep a copy in the plan's
    // buffer rather than trusting the caller's tensor to stay unchanged.
    Tensor saved = buffer("tokens");
    std::copy_n(tokens.data<int32_t>(), tokens.numel(), saved.data<int32_t>());
  }
  return loss_sum / static_cast<float>(int64_t{B_} * T_);
}

void GPT2::backward() {
  MEMFIT_CHECK(backward_ready_, "gpt2", "backward() without a training forward() before it");
  backward_ready_ = false;
  auto buf = [this](const std::string& tag) { return buffer(tag); };
  auto p = [this](int l, const char* what) { return param(fmt::format("h.{}.{}", l, what)); };
  auto g = [this](int l, const char* what) { return grad(fmt::format("h.{}.{}", l, what)); };

  Tensor dres = buf("ws.dresidual"), dC = buf("ws.dC"), gelu = buf("ws.gelu"),
         d4C = buf("ws.d4C"), dqkv = buf("ws.dqkv"), att_ws = buf("ws.attention");
  // In bf16/fp16 the residual gradient stays f32 and a rounded copy is the projections' dout;
  // d(atty) is computed straight into the attention backward's dtype.
  const bool mixed = params_.dtype() != DType::f32;
  Tensor dres_h = mixed ? buf("ws.dresidual.half") : dres;
  Tensor datty = mixed ? buf("ws.dC.half") : dC;
  auto round_dres = [&] {
    if (mixed) convert(dres_h, dres);
  };
  // dC holds d(ln_f) from the fused LM head.
  enter(PhaseKind::ln_f_backward);
  dres.zero();
  Tensor dlnf_w = grad("ln_f.weight"), dlnf_b = grad("ln_f.bias");
  layernorm_backward(dres, dlnf_w, dlnf_b, dC, block_input(config_.n_layer),
                     param("ln_f.weight"), buf("ln_f.mean"), buf("ln_f.rstd"));
  int segment = static_cast<int>(slots_.segments.size()) - 1;
  for (int l = config_.n_layer - 1; l >= 0; --l) {
    // Checkpointing: entering a recomputed segment from its last block, rerun its forward from
    // the kept input of its first block. Selective: recompute this block's probabilities.
    if (segment >= 0 && slots_.segments[segment].second == l) {
      const auto [first, last] = slots_.segments[segment--];
      for (int k = first; k <= last; ++k) {
        enter(PhaseKind::recompute, k);
        BlockActs bk = block_acts(k);
        forward_block(k, block_input(k), bk);
      }
    }
    enter(PhaseKind::backward, l);
    BlockActs b = block_acts(l);
    if (plan_.options.ckpt.selective() && plan_.options.attention == AttentionKind::plain) {
      // The output is the same as the saved atty; it goes to free scratch instead.
      plain_attention_forward(mixed ? buf("ws.dC.half") : dC, b.att, b.qkv);
    }
    Tensor x = block_input(l);

    // MLP: dres is d(residual_3) and flows on unchanged to residual_2 through the skip path.
    gelu_forward(gelu, b.fch);  // recomputed, not saved (see activation_plan.cpp)
    round_dres();
    mm_backward(d4C, g(l, "mlp.c_proj.weight"), g(l, "mlp.c_proj.bias"), dres_h, gelu,
                p(l, "mlp.c_proj.weight"));
    gelu_backward(d4C, b.fch, d4C);
    mm_backward(dC, g(l, "mlp.c_fc.weight"), g(l, "mlp.c_fc.bias"), d4C, b.ln2,
                p(l, "mlp.c_fc.weight"));
    Tensor dln2w = g(l, "ln_2.weight"), dln2b = g(l, "ln_2.bias");
    layernorm_backward(dres, dln2w, dln2b, dC, b.r2, p(l, "ln_2.weight"), b.ln2_mean,
                       b.ln2_rstd);
    // Attention: dres is now d(residual_2) and flows on to x.
    round_dres();
    mm_backward(datty, g(l, "attn.c_proj.weight"), g(l, "attn.c_proj.bias"), dres_h, b.atty,
                p(l, "attn.c_proj.weight"));
    if (plan_.options.attention == AttentionKind::flash)
      flash_attention_backward(dqkv, datty, b.qkv, b.atty, b.lse, att_ws, config_.n_head);
    else
      attention_backward(dqkv, datty, b.qkv, b.att, att_ws, config_.n_head);
    mm_backward(dC, g(l, "attn.c_attn.weight"), g(l, "attn.c_attn.bias"), dqkv, b.ln1,
                p(l, "attn.c_attn.weight"));
    Tensor dln1w = g(l, "ln_1.weight"), dln1b = g(l, "ln_1.bias");
    layernorm_backward(dres, dln1w, dln1b, dC, x, p(l, "ln_1.weight"), b.ln1_mean, b.ln1_rstd);
  }
  enter(PhaseKind::embedding_backward);
  Tensor dwte = grad("wte.weight"), dwpe = grad("wpe.weight");
  embedding_backward(dwte, dwpe, dres, buf("tokens"));
  if (poison_) poison_edges(phase_, -1);
}

void GPT2::logits(const Tensor& tokens, Tensor& out) {
  MEMFIT_CHECK(B_ > 0, "gpt2", "logits before reserve()");
  const int64_t N = int64_t{B_} * T_, C = config_.d_model, V = config_.vocab_size;
  expect_tensor(out, "gpt2.logits", "logits", {B_, T_, V});
  forward_blocks(tokens);
  backward_ready_ = false;
  enter(PhaseKind::lm_head);
  Tensor lnf = buffer("ln_f").reshape({N, C}), logits_ws = buffer("ws.logits");
  Tensor wte = param("wte.weight"), no_bias;
  const int64_t R = logits_ws.size(0), Vp = config_.padded_vocab;
  float* dst = out.data<float>();
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t r1 = std::min(N, r0 + R);
    Tensor block = logits_ws.slice(0, r1 - r0);
    mm_forward(block, lnf.slice(r0, r1), wte, no_bias);
    const float* src = block.data<float>();
    for (int64_t r = 0; r < r1 - r0; ++r)
      std::copy_n(src + r * Vp, V, dst + (r0 + r) * V);
  }
}

std::string GPT2::first_non_finite() {
  auto scan = [&](const Tensor& slab, const char* what) -> std::string {
    if (!slab.defined()) return {};
    for (const ParamInfo& p : layout_.params())
      if (!all_finite(slab.view(p.offset, {p.numel}))) return fmt::format("{} ({})", p.name, what);
    return {};
  };
  if (std::string s = scan(master_, "master weight"); !s.empty()) return s;
  if (std::string s = scan(params_, "weight"); !s.empty()) return s;
  for (size_t i = 0; i < buffers_.size(); ++i) {
    const std::string& tag = plan_.buffers[i].tag;
    const Tensor& t = buffers_[i];
    // Scratch, recomputation slots and buffers whose bytes another buffer reuses may hold
    // stale data from another block or buffer.
    if (t.dtype() == DType::i32 || tag.starts_with("ws.") || tag.starts_with("rc.") ||
        plan_.shares_bytes(i))
      continue;
    if (!all_finite(t)) return fmt::format("{} (activation)", tag);
  }
  // The backward writes the gradients from the last layer to the embeddings.
  const auto& ps = layout_.params();
  for (auto it = ps.rbegin(); it != ps.rend(); ++it)
    if (!all_finite(grads_.view(it->offset, {it->numel})))
      return fmt::format("{} (gradient)", it->name);
  return {};
}

}  // namespace memfit
