#include "memfit/model/activation_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/attention.h"
#include "memfit/kernels/cpu/flash_attention.h"
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

size_t BufferSpec::bytes() const {
  return MemoryPool::round_up(static_cast<size_t>(shape.numel()) * dtype_size(dtype));
}

std::vector<BufferSpec> gpt2_activation_plan(const GPT2Config& c, int B, int T,
                                             const ActivationOptions& options) {
  const int64_t N = static_cast<int64_t>(B) * T, C = c.d_model, NH = c.n_head;
  const auto act = Category::activations;
  const auto ws = Category::workspace;
  std::vector<BufferSpec> plan;
  auto add = [&](std::string tag, Shape shape, Category cat, DType dt = DType::f32) {
    plan.push_back({std::move(tag), shape, dt, cat});
  };
  // Saved in forward, read in backward. The GELU output is not kept: backward recomputes it
  // from the saved pre-activation into a workspace buffer (one cheap pass per layer that saves
  // 4C floats per token per layer, a quarter of the block's activations).
  add("tokens", {B, T}, act, DType::i32);
  add("targets", {B, T}, act, DType::i32);
  add("encoded", {B, T, C}, act);
  for (int l = 0; l < c.n_layer; ++l) {
    auto t = [l](const char* what) { return fmt::format("h.{}.{}", l, what); };
    add(t("ln_1"), {B, T, C}, act);
    add(t("ln_1.mean"), {N}, act);
    add(t("ln_1.rstd"), {N}, act);
    add(t("qkv"), {B, T, 3 * C}, act);
    if (options.attention == AttentionKind::flash)
      add(t("lse"), {B, NH, T}, act);
    else
      add(t("att"), {B, NH, T, T}, act);
    add(t("atty"), {B, T, C}, act);
    add(t("residual_2"), {B, T, C}, act);
    add(t("ln_2"), {B, T, C}, act);
    add(t("ln_2.mean"), {N}, act);
    add(t("ln_2.rstd"), {N}, act);
    add(t("fch"), {B, T, 4 * C}, act);
    add(t("residual_3"), {B, T, C}, act);
  }
  add("ln_f", {B, T, C}, act);
  add("ln_f.mean", {N}, act);
  add("ln_f.rstd", {N}, act);
  // Scratch shared by every layer's backward and by the LM head.
  const int64_t R = std::min<int64_t>(options.lm_head_chunk, N);
  add("ws.logits", {R, c.padded_vocab}, ws);
  add("ws.losses", {N}, ws);
  add("ws.dresidual", {B, T, C}, ws);
  add("ws.dC", {B, T, C}, ws);  // d(ln_f) from the LM head, then d(ln_2), d(atty), d(ln_1)
  add("ws.gelu", {B, T, 4 * C}, ws);
  add("ws.d4C", {B, T, 4 * C}, ws);
  add("ws.dqkv", {B, T, 3 * C}, ws);
  auto floats = [](size_t bytes) { return static_cast<int64_t>((bytes + 3) / 4); };
  if (options.attention == AttentionKind::flash) {
    add("ws.attention", {floats(kernels::flash_attention_backward_workspace_bytes(B, T, C, c.n_head))},
        ws);
    add("ws.attention_fwd",
        {floats(kernels::flash_attention_forward_workspace_bytes(B, T, C, c.n_head))}, ws);
  } else {
    add("ws.attention", {floats(kernels::attention_backward_workspace_bytes(B, T, C, c.n_head))},
        ws);
  }
  return plan;
}

size_t plan_bytes(const std::vector<BufferSpec>& plan, Category category) {
  size_t total = 0;
  for (const BufferSpec& b : plan)
    if (b.category == category) total += b.bytes();
  return total;
}

}  // namespace memfit
