// AdamW with 4-bit moments ("Memory Efficient Optimizers with 4-bit States", Li, Chen, Zhu,
// NeurIPS 2023): the first moment block-wise (128 values an absmax, the signed dynamic-exponent
// map), the second on the zero-free linear map with rank-1 scales for matrices (block-wise for
// 1-D tensors); two codes a byte: about 1 byte of state per parameter plus 4 per 128-value block
// and 4 per row and column, against AdamW's 8. Tensors under 4096 values keep FP32 moments.
// Rank-1 scales span a whole matrix, so a range may cut a matrix only at its ends (ZeRO shards
// and offload blocks hold whole matrices). Decay only on ParamInfo::decay tensors; f32 weights
// (master or fp32), not pure bf16. See Note [4-bit optimizer].
#pragma once

#include "memfit/optim/optimizer.h"
#include "memfit/optim/quantized_state.h"
#include "memfit/optim/tensor_split.h"

namespace memfit {

class AdamW4bit : public Optimizer {
 public:
  // State m.codes, m.absmax, m.f32, v.codes, v.absmax, v.rowcol, v.f32; empty parts are absent.
  AdamW4bit(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
            std::optional<ElementRange> range = std::nullopt);
  AdamW4bit(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool)
      : AdamW4bit(config, layout, &pool) {}
  std::string name() const override { return "adamw4bit"; }
  // The second moment's cuts (whole matrices, 128-value blocks of 1-D tensors) are also the
  // first moment's.
  int64_t next_cut(int64_t x) const override { return v_layout_.next_cut(x); }
  static size_t state_bytes_for(const ParamLayout& layout);
  // The two moments' layouts: m block-wise, v with rank-1 scales for matrices.
  static QuantFormat first_moment_format() { return {128, 4, false}; }
  static QuantFormat second_moment_format() { return {128, 4, true}; }
  // Under --tp: a rank-1 matrix cut by rows takes its column maxima's maximum over split.group,
  // one cut by columns its row maxima's, so its scales are the whole matrix's (Note [Tensor
  // parallel], "Optimizers"); the first moment's blocks are the whole tensors' where
  // sliced_optimizer_refusal let the run start.
  void set_tensor_split(TensorSplit split) { split_ = std::move(split); }

 protected:
  std::vector<StateSpec> whole_state() const override { return specs_; }
  int64_t state_position(size_t i, int64_t x) const override {
    return (i < v_first_ ? m_layout_ : v_layout_).position(parts_[i], x);
  }
  void update(const Piece& piece, Tensor& w, const Tensor& g, float lr,
              float grad_scale) override;

 private:
  QuantizedStateLayout m_layout_, v_layout_;
  std::vector<StateSpec> specs_;
  std::vector<QuantizedStateLayout::Part> parts_;
  size_t v_first_ = 0;  // specs_[v_first_..] are v's
  QuantizedStateLayout::Moment m_, v_;
  TensorSplit split_;
};

}  // namespace memfit
