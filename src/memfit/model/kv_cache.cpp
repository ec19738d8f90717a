#include "memfit/model/kv_cache.h"

#include <algorithm>

#include <fmt/format.h>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/cached_attention.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/model/block_step.h"

namespace memfit {

const KvBuffer& KvPlan::buffer(const std::string& tag) const {
  for (const KvBuffer& b : scratch)
    if (b.tag == tag) return b;
  MEMFIT_THROW(Error, "kv_plan", "no scratch buffer '{}'", tag);
}

bool KvPlan::has(const std::string& tag) const {
  return std::any_of(scratch.begin(), scratch.end(),
                     [&](const KvBuffer& b) { return b.tag == tag; });
}

std::string KvPlan::describe(const ModelConfig& c) const {
  return fmt::format(
      "kv cache {} ({} layers x 2 x {} positions x {} {}), step scratch {} ({} rows a step)",
      format_mib(cache_bytes), c.n_layer, context, int64_t{c.n_kv_head} * c.head_size(),
      dtype_name(cache_dtype), format_mib(scratch_bytes), rows);
}

KvPlan plan_kv_decode(const ModelConfig& c, Precision precision, int rows) {
  MEMFIT_CHECK(rows > 0, "kv_plan", "steps of {} rows", rows);
  KvPlan p;
  p.context = c.max_seq_len;
  p.rows = std::min(rows, c.max_seq_len);
  const DType h = half_dtype(precision), f32 = DType::f32;
  p.cache_dtype = h;
  const int64_t R = p.rows, T = p.context, C = c.d_model, hs = c.head_size();
  const int64_t kv = int64_t{c.n_kv_head} * hs;
  p.cache_bytes = MemoryPool::round_up(static_cast<size_t>(c.n_layer) * 2 * T * kv * dtype_size(h));
  auto add = [&](std::string tag, Shape shape, DType dtype, size_t bytes = 0) {
    if (bytes == 0) bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
    bytes = MemoryPool::round_up(bytes);
    p.scratch.push_back({std::move(tag), shape, dtype, p.scratch_bytes, bytes});
    p.scratch_bytes += bytes;
  };
  // The step's buffers, in the order the step writes them (kv_decoder.cpp).
  add("kv.tokens", {1, R}, DType::i32);
  add("kv.x", {1, R, C}, f32);  // the residual stream
  add("kv.norm", {R, C}, h);
  switch (c.family) {
    case Family::gpt2: add("kv.mean", {R}, f32); break;
    case Family::llama: add("kv.rope", {T, hs}, f32); break;  // every position's rotation
  }
  add("kv.rstd", {R}, f32);
  add("kv.qkv", {R, c.qkv_width()}, h);
  add("kv.scores", {static_cast<int64_t>(
                       kernels::cached_attention_scores_bytes(R, {c.n_head, c.n_kv_head}, T) /
                       sizeof(float))},
      f32);
  add("kv.atty", {R, c.attn_width()}, h);
  add("kv.proj", {R, C}, f32);
  add("kv.fc", {R, c.fc_width()}, h);
  add("kv.act", {R, c.ffn_dim}, h);
  if (const size_t widen = widen_scratch_bytes(c, R, h))
    add("kv.widen", {static_cast<int64_t>(widen / sizeof(float))}, f32);
  if (kernels::matmul_widens(h))
    add("kv.widen.head",
        {static_cast<int64_t>(
            kernels::matmul_widened_blocked_scratch_bytes(1, C, c.padded_vocab) / sizeof(float))},
        f32);
  add("kv.logits", {1, c.padded_vocab}, f32);  // the last row's alone: what sampling reads
  return p;
}

KvCache::KvCache(const ModelConfig& c, const KvPlan& plan, MemoryPool& pool) {
  all_ = Tensor::empty(pool, {static_cast<int64_t>(plan.cache_bytes)}, DType::i8,
                       Category::activations, "kv.cache");
  const int64_t T = plan.context, kv = int64_t{c.n_kv_head} * c.head_size();
  const size_t layer_bytes = static_cast<size_t>(T * kv) * dtype_size(plan.cache_dtype);
  for (int l = 0; l < c.n_layer; ++l) {
    keys_.push_back(all_.view_bytes(2 * l * layer_bytes, {T, kv}, plan.cache_dtype));
    values_.push_back(all_.view_bytes((2 * l + 1) * layer_bytes, {T, kv}, plan.cache_dtype));
  }
}

}  // namespace memfit
