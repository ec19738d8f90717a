// Adam-mini (Zhang et al. 2024): AdamW's per-parameter first moment, but one second-moment value
// per block of parameters, so about 4 bytes of state per parameter against AdamW's 8. The blocks
// follow the transformer's structure (Note [Adam-mini partition], docs/notes/adam-mini.md):
// query and key per head, value and the other linear weights per output neuron (row),
// embeddings per token (row), LayerNorm per tensor, linear biases per element. Under --tp a
// rank's layout is its slices (its heads of q and k, its rows of the column-parallel matrices,
// its columns of every row of the row-parallel ones: those rows' sums over the tensor group).
#pragma once

#include <cstdint>
#include <vector>

#include "memfit/optim/optimizer.h"
#include "memfit/optim/tensor_split.h"

namespace memfit {

// A run of equal consecutive blocks inside one parameter, each sharing one v value.
struct AdamMiniSegment {
  int param_index;    // into ParamLayout::params()
  int64_t offset;     // first element, from the parameter slab's start
  int64_t numel;      // a multiple of block_len
  int64_t block_len;  // elements per v value
  int64_t v_offset;   // first v value, from the v slab's start
};

class AdamMini : public Optimizer {
 public:
  // config.n_head must be the model's head count and divide the width; ConfigError otherwise.
  // State "m" (f32, one per element) and "v" (f32, one value per block, rounded up to 16).
  AdamMini(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
           std::optional<ElementRange> range = std::nullopt);
  AdamMini(const OptimConfig& config, const ParamLayout& layout, MemoryPool& pool)
      : AdamMini(config, layout, &pool) {}
  std::string name() const override { return "adam-mini"; }
  // A cut inside a segment falls on one of its block boundaries.
  int64_t next_cut(int64_t x) const override;
  static size_t state_bytes_for(const ParamLayout& layout, int n_head);

  // The partition, in layout order; the qkv weight gives three segments (query, key, value).
  static std::vector<AdamMiniSegment> partition(const ParamLayout& layout, int n_head);
  // v values the partition needs (before rounding to whole 64-byte lines).
  static int64_t num_blocks(const ParamLayout& layout, int n_head);
  const std::vector<AdamMiniSegment>& segments() const { return segments_; }
  // Under --tp: the rows of a parameter cut by columns (the row-parallel projections) take their
  // sums of squares summed over split.group, so each row's v is the whole row's mean (Note
  // [Tensor parallel], "Optimizers"); every other block is whole on the rank already.
  void set_tensor_split(TensorSplit split) { split_ = std::move(split); }

 protected:
  std::vector<StateSpec> whole_state() const override;
  int64_t state_position(size_t i, int64_t x) const override;
  void update(const Piece& piece, Tensor& w, const Tensor& g, float lr,
              float grad_scale) override;

 private:
  // The first segment that ends after x (x is inside it or before it); segments_.size() if none.
  size_t segment_at(int64_t x) const;

  std::vector<AdamMiniSegment> segments_;
  int64_t v_elements_ = 0;  // num_blocks rounded up to 16
  TensorSplit split_;
};

}  // namespace memfit
