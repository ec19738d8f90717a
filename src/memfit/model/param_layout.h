// Where each named parameter lives in the one parameter slab. The same layout indexes the
// gradient slab and every optimizer state slab, and names tensors in checkpoints.
// Layer-major order (wte, wpe, h.0.*, h.1.*, ..., ln_f) keeps each block's parameters
// contiguous, so a later ZeRO-3 or offload can gather or move one block as one range.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "memfit/core/shape.h"
#include "memfit/core/tensor.h"

namespace memfit {

struct GPT2Config;

// What a parameter is for; optimizers that partition by structure (Adam-mini) read this.
enum class ParamRole : uint8_t {
  token_embedding,     // wte (Vp, C), tied with the LM head
  position_embedding,  // wpe (maxT, C)
  norm_weight,         // LayerNorm gain (C)
  norm_bias,           // LayerNorm bias (C)
  attn_qkv_weight,     // (3C, C): rows [0,C) query, [C,2C) key, [2C,3C) value; heads of hs rows
  attn_proj_weight,    // (C, C)
  mlp_fc_weight,       // (4C, C)
  mlp_proj_weight,     // (C, 4C)
  linear_bias,         // any linear layer's bias
};

struct ParamInfo {
  std::string name;  // Hugging Face GPT-2 name without "transformer.": "h.0.attn.c_attn.weight"
  Shape shape;       // memfit's layout; linear weights are (out, in) as torch.nn.Linear
  int64_t offset;    // elements from the slab's start, a multiple of 16 (64-byte aligned)
  int64_t numel;
  int layer;         // block index, or -1 for embeddings and ln_f
  ParamRole role;
  bool decay;        // weight decay applies: 2-D weights yes, biases and LayerNorm no
};

class ParamLayout {
 public:
  explicit ParamLayout(const GPT2Config& config);
  const std::vector<ParamInfo>& params() const { return params_; }
  int64_t total() const { return total_; }  // slab elements, alignment padding included
  const ParamInfo& find(const std::string& name) const;  // throws if absent
  // The named parameter as a view into a slab laid out by this layout.
  Tensor view(const Tensor& slab, const ParamInfo& p) const;
  Tensor view(const Tensor& slab, const std::string& name) const { return view(slab, find(name)); }

 private:
  std::vector<ParamInfo> params_;
  int64_t total_ = 0;
};

}  // namespace memfit
