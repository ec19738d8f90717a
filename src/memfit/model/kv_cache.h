// Generation's memory, planned before it is allocated (Note [KV cache], docs/notes/kv-cache.md):
// each layer's keys and values of every position so far (the cache), and the scratch of one
// decode step of at most `rows` new tokens. The plan states both in bytes; KvCache and the
// decoder (kv_decoder.h) allocate exactly what it states, from the tracking pool, so the pool's
// peak over a sampling run is the weights plus KvPlan::total().
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "memfit/core/shape.h"
#include "memfit/memory/tensor.h"
#include "memfit/memory/pool.h"
#include "memfit/model/model_config.h"
#include "memfit/model/precision.h"

namespace memfit {

// One buffer of the step's scratch, at `offset` bytes into the one workspace allocation.
struct KvBuffer {
  std::string tag;
  Shape shape;
  DType dtype;
  size_t offset = 0, bytes = 0;  // bytes: rounded up to the pool's alignment
};

struct KvPlan {
  int rows = 0;     // new tokens one step takes at most (a prompt is prefilled in such chunks)
  int context = 0;  // positions the cache holds: the model's max_seq_len
  DType cache_dtype = DType::f32;  // half_dtype(precision): what the training step saves qkv in
  // Keys and values of every layer: n_layer x 2 x context x n_kv_head x head_size elements,
  // one pool allocation (Category::activations, tag "kv.cache").
  size_t cache_bytes = 0;
  std::vector<KvBuffer> scratch;  // in one pool allocation (Category::workspace, "kv.scratch")
  size_t scratch_bytes = 0;

  size_t total() const { return cache_bytes + scratch_bytes; }
  const KvBuffer& buffer(const std::string& tag) const;  // throws if absent
  bool has(const std::string& tag) const;
  // "kv cache 18.0 MiB (12 layers x 2 x 1024 positions x 768 f32), step scratch 4.1 MiB (64 rows)"
  std::string describe(const ModelConfig& config) const;
};

inline constexpr int kDefaultKvRows = 64;

// The plan for `config` in `precision`, steps of at most `rows` tokens (clamped to the context).
KvPlan plan_kv_decode(const ModelConfig& config, Precision precision, int rows = kDefaultKvRows);

// The cache: per layer, keys and values as (context, n_kv_head * head_size) views of one
// allocation of plan.cache_bytes.
class KvCache {
 public:
  KvCache(const ModelConfig& config, const KvPlan& plan, MemoryPool& pool);
  Tensor& keys(int layer) { return keys_[static_cast<size_t>(layer)]; }
  Tensor& values(int layer) { return values_[static_cast<size_t>(layer)]; }

 private:
  Tensor all_;
  std::vector<Tensor> keys_, values_;
};

}  // namespace memfit
