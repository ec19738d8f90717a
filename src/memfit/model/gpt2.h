// GPT-2: the parameter and gradient slabs, the activation buffers of one micro-batch, and the
// layer-by-layer forward and backward over them (llm.c's structure on memfit's kernels).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "memfit/core/tensor.h"
#include "memfit/memory/pool.h"
#include "memfit/model/activation_plan.h"
#include "memfit/model/gpt2_config.h"
#include "memfit/model/param_layout.h"

namespace memfit {

class GPT2 {
 public:
  // Allocates the parameter slab (Category::params) and the gradient slab (Category::grads).
  GPT2(const GPT2Config& config, MemoryPool& pool);

  const GPT2Config& config() const { return config_; }
  const ParamLayout& layout() const { return layout_; }
  Tensor& params() { return params_; }
  Tensor& grads() { return grads_; }
  Tensor param(const std::string& name) const { return layout_.view(params_, name); }
  Tensor grad(const std::string& name) const { return layout_.view(grads_, name); }

  // GPT-2's initialisation: weights normal(0, 0.02), residual projections (attn.c_proj,
  // mlp.c_proj) scaled by 1/sqrt(2 n_layer), biases 0, LayerNorm gains 1, padded vocab rows 0.
  void init_weights(uint64_t seed);

  // Allocates the activation plan for micro-batches of B x T (T <= max_seq_len) once; calling
  // it again with the same sizes does nothing, with other sizes reallocates.
  void reserve(int B, int T, const ActivationOptions& options = {});
  int batch() const { return B_; }
  int seq_len() const { return T_; }
  AttentionKind attention() const { return options_.attention; }

  // Mean cross-entropy of predicting targets (B,T) from tokens (B,T), both i32 in [0, vocab).
  // With `training`, also runs the LM head's backward as it goes (Note [Fused LM head]): the
  // gradient of wte from the head is accumulated and d(ln_f) is kept for backward(), which must
  // follow before the next forward. The loss gradient is 1/(B*T) per position.
  float forward(const Tensor& tokens, const Tensor& targets, bool training);
  // Accumulates (+=) every parameter's gradient of the last training forward into grads().
  void backward();
  void zero_grad() { grads_.zero(); }

  // Logits (B, T, vocab_size) of every position, for evaluation against other implementations
  // and for sampling. `logits` is f32 (B, T, vocab_size).
  void logits(const Tensor& tokens, Tensor& logits);

  // The activation and workspace buffers by tag, as allocated by reserve().
  const Tensor& buffer(const std::string& tag) const;

 private:
  void forward_blocks(const Tensor& tokens);
  void lm_head(const Tensor& targets, bool training, float* loss_sum);

  GPT2Config config_;
  MemoryPool& pool_;
  ParamLayout layout_;
  Tensor params_, grads_;
  int B_ = 0, T_ = 0;
  ActivationOptions options_;
  std::map<std::string, Tensor> buffers_;
  bool backward_ready_ = false;
};

}  // namespace memfit
