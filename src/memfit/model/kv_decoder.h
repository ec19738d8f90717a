// The inference forward of generation (Note [KV cache], docs/notes/kv-cache.md): appends tokens
// at the next positions, each layer's keys and values kept in a KvCache, so each new token
// costs one row of every matmul instead of a forward over the whole context. Both families:
// GPT-2's learned position embedding is read at the token's position; LLaMA's rotation is the
// row of its position in a table of every position (RoPE with a position offset), over
// grouped-query heads. The training step (transformer_step.h) stays the reference: the same
// kernels in the same order per row, so the logits agree with a full-context forward within
// float rounding of the attention's sums (kv_decoder_test.cpp states the tolerance).
#pragma once

#include <cstdint>
#include <span>

#include "memfit/memory/tensor.h"
#include "memfit/memory/pool.h"
#include "memfit/model/kv_cache.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/precision.h"

namespace memfit {

class KvDecoder {
 public:
  // `weights`: the model's working weights in half_dtype(precision), whole (not a ZeRO shard,
  // not on disk), outliving the decoder. Allocates plan.cache_bytes and plan.scratch_bytes from
  // `pool` (plan: plan_kv_decode for this config and precision) and nothing after.
  KvDecoder(const ModelConfig& config, Precision precision, const ModelWeights& weights,
            MemoryPool& pool, const KvPlan& plan);

  const KvPlan& plan() const { return plan_; }
  int position() const { return position_; }  // tokens in the cache
  int context() const { return plan_.context; }

  // Runs the tokens at positions [position(), position() + n), in steps of at most plan().rows
  // (prefill), and returns the f32 logits (vocab_size) of the last of them, valid until the next
  // call. n >= 1 and position() + n <= context(): a full cache is an error (the caller decides
  // what to do past the context).
  std::span<const float> append(std::span<const int32_t> tokens);
  // Forgets every position: the next append starts at 0.
  void reset() { position_ = 0; }

 private:
  void step(std::span<const int32_t> tokens, bool logits);
  Tensor scratch(const std::string& tag) const;
  void linear(Tensor out, const Tensor& inp, const Tensor& weight, const Tensor& bias);

  const ModelConfig config_;
  const Precision precision_;
  const ModelWeights& w_;
  const KvPlan plan_;
  KvCache cache_;
  Tensor scratch_;
  int position_ = 0;
};

}  // namespace memfit
