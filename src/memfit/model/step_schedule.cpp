#include "memfit/model/step_schedule.h"

#include <fmt/format.h>

#include <algorithm>

#include "memfit/kernels/cpu/matmul_widened.h"

namespace memfit {

std::string Phase::name() const {
  switch (kind) {
    case PhaseKind::embedding: return "embedding";
    case PhaseKind::forward: return fmt::format("forward of block {}", layer);
    case PhaseKind::ln_f: return "ln_f";
    case PhaseKind::lm_head: return "LM head";
    case PhaseKind::ln_f_backward: return "backward of ln_f";
    case PhaseKind::recompute: return fmt::format("recomputation of block {}", layer);
    case PhaseKind::backward: return fmt::format("backward of block {}", layer);
    case PhaseKind::embedding_backward: return "embedding backward";
  }
  return "?";
}

void PhaseUses::use(const std::string& tag, Access access) {
  auto seen = [&](const auto& u) { return u.first == tag; };
  if (std::none_of(uses.begin(), uses.end(), seen)) uses.emplace_back(tag, access);
}

// Each phase below lists, in the order gpt2.cpp touches them, the buffers of the matching code
// there: keep the two in step (the phase order is enforced by GPT2::enter, the accesses by the
// poisoning test).
std::vector<PhaseUses> gpt2_step_schedule(const GPT2Config& c, const ActivationOptions& o) {
  const BlockSlots slots = block_slots(o.ckpt, c.n_layer);
  const bool flash = o.attention == AttentionKind::flash;
  const bool mixed = o.precision != Precision::fp32;
  const bool widen = kernels::matmul_widens(half_dtype(o.precision));
  const bool selective_plain = o.ckpt.selective() && !flash;
  constexpr Access W = Access::write, R = Access::read;
  std::vector<PhaseUses> s;
  auto phase = [&](PhaseKind kind, int layer = -1) -> PhaseUses& {
    s.push_back({{kind, layer}, {}});
    return s.back();
  };
  auto matmuls = [&](PhaseUses& p) {
    if (widen) p.use("ws.widen", W);  // operands widened for oneDNN (matmul_widened.h)
  };
  // GPT2::forward_block: the projections' outputs go to ws.dC, the GELU's to ws.gelu.
  auto block_forward = [&](PhaseUses& p, int l) {
    const BlockTags b = block_tags(slots, l, o);
    p.use(block_input_tag(slots, l, o), R);
    for (const std::string* t : {&b.ln1, &b.ln1_mean, &b.ln1_rstd, &b.qkv, &b.atty, &b.r2, &b.ln2,
                                 &b.ln2_mean, &b.ln2_rstd, &b.fch, &b.r3})
      p.use(*t, W);
    p.use(flash ? b.lse : b.att, W);
    if (flash || mixed) p.use("ws.attention_fwd", W);
    p.use("ws.dC", W);
    p.use("ws.gelu", W);
    matmuls(p);
  };

  phase(PhaseKind::embedding).use("encoded", W);
  for (int l = 0; l < c.n_layer; ++l) block_forward(phase(PhaseKind::forward, l), l);
  {
    PhaseUses& p = phase(PhaseKind::ln_f);
    p.use(block_input_tag(slots, c.n_layer, o), R);
    for (const char* t : {"ln_f", "ln_f.mean", "ln_f.rstd"}) p.use(t, W);
  }
  {
    // GPT2::lm_head, then forward() saves the tokens for the embedding's backward.
    PhaseUses& p = phase(PhaseKind::lm_head);
    p.use("ln_f", R);
    for (const char* t : {"ws.logits", "ws.losses", "ws.dC"}) p.use(t, W);
    if (mixed) p.use("ws.dlogits", W);
    matmuls(p);
    p.use("tokens", W);
  }
  {
    PhaseUses& p = phase(PhaseKind::ln_f_backward);
    p.use("ws.dresidual", W);  // zeroed, then accumulated into
    p.use("ws.dC", R);         // d(ln_f)
    p.use(block_input_tag(slots, c.n_layer, o), R);
    for (const char* t : {"ln_f.mean", "ln_f.rstd"}) p.use(t, R);
  }
  int segment = static_cast<int>(slots.segments.size()) - 1;
  for (int l = c.n_layer - 1; l >= 0; --l) {
    if (segment >= 0 && slots.segments[segment].second == l) {
      const auto [first, last] = slots.segments[segment--];
      for (int k = first; k <= last; ++k) block_forward(phase(PhaseKind::recompute, k), k);
    }
    PhaseUses& p = phase(PhaseKind::backward, l);
    const BlockTags b = block_tags(slots, l, o);
    if (selective_plain) {  // this block's probabilities again, the output to scratch
      p.use(b.att, W);
      p.use(mixed ? "ws.dC.half" : "ws.dC", W);
      if (mixed) p.use("ws.attention_fwd", W);
    }
    p.use("ws.gelu", W);  // the GELU output, recomputed from fch
    p.use(b.fch, R);
    p.use("ws.dresidual", R);
    if (mixed) p.use("ws.dresidual.half", W);
    p.use("ws.d4C", W);
    p.use("ws.dC", W);
    for (const std::string* t : {&b.ln2, &b.r2, &b.ln2_mean, &b.ln2_rstd, &b.atty, &b.qkv})
      p.use(*t, R);
    if (mixed) p.use("ws.dC.half", W);
    p.use(flash ? b.lse : b.att, R);
    p.use("ws.attention", W);
    p.use("ws.dqkv", W);
    for (const std::string* t : {&b.ln1, &b.ln1_mean, &b.ln1_rstd}) p.use(*t, R);
    p.use(block_input_tag(slots, l, o), R);
    matmuls(p);
  }
  {
    PhaseUses& p = phase(PhaseKind::embedding_backward);
    p.use("ws.dresidual", R);
    p.use("tokens", R);
  }
  return s;
}

}  // namespace memfit
