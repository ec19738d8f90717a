#include "memfit/model/activation_plan.h"

#include <fmt/format.h>

#include <algorithm>

#include "memfit/core/error.h"
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

ActCompress act_compress_from_name(std::string_view name) {
  if (name == "none") return ActCompress::none;
  if (name == "int8") return ActCompress::int8;
  if (name == "fp8") return ActCompress::fp8;
  MEMFIT_THROW(ConfigError, "config", "--act-compress must be none, int8 or fp8, got '{}'", name);
}

std::string_view act_compress_name(ActCompress c) {
  switch (c) {
    case ActCompress::none: return "none";
    case ActCompress::int8: return "int8";
    case ActCompress::fp8: return "fp8";
  }
  return "?";
}

DType act_codes_dtype(ActCompress c) {
  MEMFIT_CHECK(c != ActCompress::none, "config", "--act-compress none has no codes");
  return c == ActCompress::int8 ? DType::i8 : DType::u8;
}

int64_t default_lm_head_chunk(const ActivationOptions&) { return 128; }

int64_t lm_head_rows(const ActivationOptions& options, int64_t rows) {
  const int64_t chunk =
      options.lm_head_chunk > 0 ? options.lm_head_chunk : default_lm_head_chunk(options);
  return std::min(chunk, rows);
}

int64_t lm_head_grad_rows(const ActivationOptions& options, int64_t rows) {
  const DType h = half_dtype(options.precision);
  const bool grouped = h != DType::f32 && !kernels::matmul_widens(h);
  const int64_t chunk = lm_head_rows(options, rows);
  const int64_t group = options.lm_head_group > 0 ? options.lm_head_group : kLmHeadGradRows;
  return grouped ? std::min(rows, std::max(chunk, group)) : chunk;
}

int64_t lm_head_dx_rows(const ActivationOptions& options, int64_t rows) {
  return std::max(lm_head_rows(options, rows), lm_head_grad_rows(options, rows) / 2);
}

void check_activation_options(const ActivationOptions& options) {
  if (options.precision == Precision::fp16 && options.attention == AttentionKind::flash)
    MEMFIT_THROW(ConfigError, "config",
                 "--attention flash runs in fp32 and bf16; with --precision fp16 use --attention "
                 "plain");
  if (options.lm_head_group < 0)
    MEMFIT_THROW(ConfigError, "config",
                 "--lm-head-group must be 0 (the default, {}) or a number of rows, got {}",
                 kLmHeadGradRows, options.lm_head_group);
  if (options.inference && options.grads_in_arena)
    MEMFIT_THROW(ConfigError, "config",
                 "an inference plan has no gradients to keep in the activations arena");
}

size_t BufferSpec::bytes() const {
  return MemoryPool::round_up(static_cast<size_t>(shape.numel()) * dtype_size(dtype));
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

size_t plan_bytes(const std::vector<BufferSpec>& plan, Category category) {
  size_t total = 0;
  for (const BufferSpec& b : plan)
    if (b.category == category) total += b.bytes();
  return total;
}

}  // namespace memfit
