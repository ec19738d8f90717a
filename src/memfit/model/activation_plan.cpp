#include "memfit/model/activation_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/attention.h"
#include "memfit/kernels/cpu/flash_attention.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/memory/pool.h"

namespace memfit {

AttentionKind attention_kind_from_name(std::string_view name) {
  if (name == "flash") return AttentionKind::flash;
  if (name == "plain") return AttentionKind::plain;
  MEMFIT_THROW(ConfigError, "config", "--attention must be flash or plain, got '{}'", name);
}

std::string_view attention_kind_name(AttentionKind kind) {
  return kind == AttentionKind::flash ? "flash" : "plain";
}

void check_activation_options(const ActivationOptions& options) {
  if (options.precision == Precision::fp16 && options.attention == AttentionKind::flash)
    MEMFIT_THROW(ConfigError, "config",
                 "--attention flash runs in fp32 and bf16; with --precision fp16 use --attention "
                 "plain");
}

size_t BufferSpec::bytes() const {
  return MemoryPool::round_up(static_cast<size_t>(shape.numel()) * dtype_size(dtype));
}

std::vector<BufferSpec> gpt2_activation_plan(const GPT2Config& c, int B, int T,
                                             const ActivationOptions& options) {
  const int64_t N = static_cast<int64_t>(B) * T, C = c.d_model, NH = c.n_head;
  const auto act = Category::activations;
  const auto ws = Category::workspace;
  // Matmul operands and what is saved for them are in h (f32, bf16 or f16); the residual
  // stream, LayerNorm statistics, log-sum-exps, logits and losses stay f32.
  const DType f32 = DType::f32, h = half_dtype(options.precision);
  const bool mixed = h != f32;
  check_activation_options(options);
  std::vector<BufferSpec> plan;
  auto add = [&](std::string tag, Shape shape, Category cat, DType dt) {
    plan.push_back({std::move(tag), shape, dt, cat, {}, 0});
  };
  // Saved in forward, read in backward. The GELU output is not kept: backward recomputes it
  // from the saved pre-activation into a workspace buffer (one cheap pass per layer that saves
  // 4C floats per token per layer, a quarter of the block's activations).
  add("tokens", {B, T}, act, DType::i32);  // for the embedding's backward
  add("encoded", {B, T, C}, act, f32);
  // A block's buffers, under `prefix` ("h.3." for block 3's own, "rc.0." for the first slot of
  // the recomputation buffers). Selective checkpointing keeps no probabilities per block.
  const bool flash = options.attention == AttentionKind::flash;
  auto add_block = [&](const std::string& prefix, bool with_output) {
    auto t = [&](const char* what) { return prefix + what; };
    add(t("ln_1"), {B, T, C}, act, h);
    add(t("ln_1.mean"), {N}, act, f32);
    add(t("ln_1.rstd"), {N}, act, f32);
    add(t("qkv"), {B, T, 3 * C}, act, h);
    if (flash)
      add(t("lse"), {B, NH, T}, act, f32);
    else if (!options.ckpt.selective())
      add(t("att"), {B, NH, T, T}, act, h);
    add(t("atty"), {B, T, C}, act, h);
    add(t("residual_2"), {B, T, C}, act, f32);
    add(t("ln_2"), {B, T, C}, act, h);
    add(t("ln_2.mean"), {N}, act, f32);
    add(t("ln_2.rstd"), {N}, act, f32);
    add(t("fch"), {B, T, 4 * C}, act, h);
    if (with_output) add(t("residual_3"), {B, T, C}, act, f32);
  };
  // Checkpointed blocks keep only the output of each recomputed segment (the next block's
  // input); the segment's other buffers are shared slots, one block's worth per position in
  // the longest segment, refilled by the recomputation in backward.
  const BlockSlots slots = block_slots(options.ckpt, c.n_layer);
  for (int l = 0; l < c.n_layer; ++l) {
    if (slots.slot[l] < 0)
      add_block(fmt::format("h.{}.", l), true);
    else if (slots.segment_last[l])
      add(fmt::format("h.{}.residual_3", l), {B, T, C}, act, f32);
  }
  for (int j = 0; j < slots.slots; ++j) add_block(fmt::format("rc.{}.", j), j + 1 < slots.slots);
  if (options.ckpt.selective() && !flash)
    add("rc.att", {B, NH, T, T}, act, h);  // one block's probabilities, recomputed in backward
  add("ln_f", {B, T, C}, act, h);
  add("ln_f.mean", {N}, act, f32);
  add("ln_f.rstd", {N}, act, f32);
  // Scratch shared by every layer's backward and by the LM head.
  const int64_t R = std::min<int64_t>(options.lm_head_chunk, N);
  add("ws.logits", {R, c.padded_vocab}, ws, f32);
  if (mixed) add("ws.dlogits", {R, c.padded_vocab}, ws, h);  // the LM head's matmul operand
  add("ws.losses", {N}, ws, f32);
  add("ws.dresidual", {B, T, C}, ws, f32);
  // d(ln_f) from the LM head, then d(ln_2), d(atty), d(ln_1); the projections' f32 outputs in
  // forward.
  add("ws.dC", {B, T, C}, ws, f32);
  if (mixed) {
    add("ws.dresidual.half", {B, T, C}, ws, h);  // d(residual) as the projections' dout
    add("ws.dC.half", {B, T, C}, ws, h);         // d(atty): the attention backward's dout
  }
  add("ws.gelu", {B, T, 4 * C}, ws, h);
  add("ws.d4C", {B, T, 4 * C}, ws, h);
  add("ws.dqkv", {B, T, 3 * C}, ws, h);
  auto floats = [](size_t bytes) { return static_cast<int64_t>((bytes + 3) / 4); };
  if (options.attention == AttentionKind::flash) {
    add("ws.attention",
        {floats(kernels::flash_attention_backward_workspace_bytes(B, T, C, c.n_head, h))}, ws,
        f32);
    add("ws.attention_fwd",
        {floats(kernels::flash_attention_forward_workspace_bytes(B, T, C, c.n_head, h))}, ws,
        f32);
  } else {
    add("ws.attention",
        {floats(kernels::attention_backward_workspace_bytes(B, T, C, c.n_head, h, h, h, h))}, ws,
        f32);
    if (mixed)
      add("ws.attention_fwd",
          {floats(kernels::attention_forward_workspace_bytes(B, T, C, c.n_head, h, h, h))}, ws,
          f32);
  }
  if (kernels::matmul_widens(h)) {
    // No f16 matmul in oneDNN 2.6, no bf16 one below AVX-512: operands are widened into this
    // (kernels/cpu/matmul_widened.h). On such a CPU the plan differs; the planner reads it too.
    size_t widen = 0;
    for (auto [rows, in, out] : {std::array<int64_t, 3>{N, C, 3 * C}, {N, C, C}, {N, C, 4 * C},
                                 {N, 4 * C, C}, {R, C, c.padded_vocab}})
      widen = std::max(widen, kernels::matmul_widened_scratch_bytes(rows, in, out));
    add("ws.widen", {floats(widen)}, ws, f32);
  }
  return plan;
}

BlockSlots block_slots(const CheckpointPolicy& ckpt, int n_layer) {
  BlockSlots s;
  s.slot.assign(n_layer, -1);
  s.segment_last.assign(n_layer, false);
  s.segments = ckpt.segments(n_layer);
  for (auto [first, last] : s.segments) {
    for (int l = first; l <= last; ++l) s.slot[l] = l - first;
    s.segment_last[last] = true;
    s.slots = std::max(s.slots, last - first + 1);
  }
  return s;
}

BlockTags block_tags(const BlockSlots& slots, int l, const ActivationOptions& options) {
  const int slot = slots.slot[l];
  const std::string prefix = slot < 0 ? fmt::format("h.{}.", l) : fmt::format("rc.{}.", slot);
  auto t = [&](const char* what) { return prefix + what; };
  BlockTags b{t("ln_1"), t("ln_1.mean"), t("ln_1.rstd"), t("qkv"), "", "", t("atty"),
              t("residual_2"), t("ln_2"), t("ln_2.mean"), t("ln_2.rstd"), t("fch"), ""};
  if (options.attention == AttentionKind::flash)
    b.lse = t("lse");
  else
    b.att = options.ckpt.selective() ? "rc.att" : t("att");
  b.r3 = slot < 0 || slots.segment_last[l] ? fmt::format("h.{}.residual_3", l) : t("residual_3");
  return b;
}

std::string block_input_tag(const BlockSlots& slots, int l, const ActivationOptions& options) {
  return l > 0 ? block_tags(slots, l - 1, options).r3 : "encoded";
}

size_t plan_bytes(const std::vector<BufferSpec>& plan, Category category) {
  size_t total = 0;
  for (const BufferSpec& b : plan)
    if (b.category == category) total += b.bytes();
  return total;
}

}  // namespace memfit
