// APOLLO and APOLLO-Mini (Zhu et al. 2024, "APOLLO: SGD-like Memory, AdamW-level Performance"):
// each linear weight of attention and MLP, G (m x n), is scaled by factors that Adam moments of
// a random projection of G give, so its state is r x max(m, n) instead of 2 m n. Channel-wise
// scaling for apollo (rank 256 by default), one tensor-wise factor for apollo-mini (rank 1,
// update scaled by sqrt(128)); the norm-growth limiter (gamma 1.01) and AdamW's decoupled decay
// as the paper's code (github.com/zhuhanqing/APOLLO, apollo_torch/apollo.py). Every other
// parameter (embeddings, LM head, norms, biases) is stepped by AdamW (torch.optim.AdamW).
// Note [APOLLO] in docs/notes/apollo.md says what was chosen where the paper leaves room.
#pragma once

#include <cstdint>
#include <vector>

#include "memfit/optim/optimizer.h"

namespace memfit {

class Apollo : public Optimizer {
 public:
  // config.name is "apollo" (channel-wise) or "apollo-mini" (tensor-wise); config.rank (0: 256
  // or 1) capped at each matrix's smaller side, config.proj_gap steps per projection.
  // State: "m" and "v" (f32: AdamW's per element for the other parameters, r x max(m, n) per
  // projected matrix), "limiter" (f32, each projected matrix's last scaled-gradient norm).
  Apollo(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
         std::optional<ElementRange> range = std::nullopt);
  std::string name() const override { return config_.name; }
  // Pure bf16 weights: stochastic rounding, element i's bits from (seed, t, i) as AdamW's, so
  // any range rounds each element as the whole layout does.
  bool updates_bf16_weights() const override { return true; }
  // Projected matrices are cut only at their edges: their state is per matrix.
  int64_t next_cut(int64_t x) const override;
  int64_t scratch_elements() const override { return scratch_; }
  // The projections R = G P^T or P^T G of the range's matrices: 2 r m n each.
  double update_flops() const override;

  // Whether APOLLO projects this parameter (2-D attention and MLP weights).
  static bool projects(const ParamInfo& p);
  // The rank a projected matrix gets: min(apollo_rank(config), min(m, n)).
  static int64_t rank_for(const OptimConfig& config, const ParamInfo& p);
  // A pipeline stage's layout (Note [Pipeline parallel], "Optimizers"): its parameter i is
  // parameter `base` + i of the whole model's, the index a matrix's projection is drawn by, so
  // a stage projects each matrix as one process does (0, the default, for the whole model).
  // Only blocks' matrices are projected, and a stage's blocks come before its tied copy.
  void set_param_index_base(int64_t base) { index_base_ = base; }

 protected:
  std::vector<StateSpec> whole_state() const override;
  int64_t state_position(size_t i, int64_t x) const override;
  void update(const Piece& piece, Tensor& w, const Tensor& g, float lr,
              float grad_scale) override;

 private:
  void update_matrix(const Piece& piece, Tensor& w, const float* g, float lr, float grad_scale);

  std::vector<int64_t> moment_at_;  // per parameter: its first m/v value (64-byte aligned)
  std::vector<int64_t> moments_;    // per parameter: its m/v values
  std::vector<int64_t> limiter_at_;  // per parameter: projected matrices before it
  int64_t moment_total_ = 0, limiter_total_ = 0, scratch_ = 0;
  int64_t index_base_ = 0;
};

}  // namespace memfit
