// GaLore (Zhao et al. 2024, "GaLore: Memory-Efficient LLM Training by Gradient Low-Rank
// Projection"): each linear weight of attention and MLP, G (m x n), is projected every
// --optim-proj-gap steps onto its top-r singular vectors on the smaller side (an SVD of that
// step's gradient, galore_projector.h); Adam runs on the projected r x max(m, n) gradient, and
// its normalised update is projected back and scaled by alpha = 0.25 (the authors' code,
// galore_torch/adamw.py and galore_projector.py, proj_type "std"). `galore8bit` keeps every
// moment in 8 bits block-wise (galore_torch/adamw8bit.py on bitsandbytes' 8-bit AdamW; here
// quantized_state.h and AdamW8bit's kernel). The projector is state (f32, saved), so a resumed
// run continues bit for bit. Every other parameter (embeddings, head, norms, biases) is stepped
// by AdamW (galore: f32 moments; galore8bit: 8-bit ones, as adamw8bit). Note [GaLore] in
// docs/notes/galore.md.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "memfit/optim/optimizer.h"
#include "memfit/optim/quantized_state.h"

namespace memfit {

class Galore : public Optimizer {
 public:
  // config.name is "galore" or "galore8bit"; config.rank (0: 128) capped at each matrix's
  // smaller side; config.proj_gap steps between projectors (the paper's update_proj_gap).
  // State: galore "m", "v" (f32); galore8bit the 8-bit moments' parts as adamw8bit's ("m.codes",
  // "m.absmax", "m.f32", "v.*"), over r x max(m, n) values per projected matrix and one per
  // element elsewhere; and "proj" (f32, r x min(m, n) per projected matrix).
  Galore(const OptimConfig& config, const ParamLayout& layout, MemoryPool* pool,
         std::optional<ElementRange> range = std::nullopt);
  std::string name() const override { return config_.name; }
  // Projected matrices are cut only at their edges: their moments and projector are per matrix.
  int64_t next_cut(int64_t x) const override;
  int64_t scratch_elements() const override { return scratch_; }
  // The projections (2 r m n) and back (2 r m n) of the range's matrices, and their SVDs
  // amortised over the projection gap.
  double update_flops() const override;

  // Whether GaLore projects this parameter: APOLLO's choice, the 2-D weights of attention and
  // MLP (the paper's target_modules "attn" and "mlp").
  static bool projects(const ParamInfo& p);
  // The rank a projected matrix gets: min(galore_rank(config), min(m, n)).
  static int64_t rank_for(const OptimConfig& config, const ParamInfo& p);
  // The update's scale alpha (galore_torch's `scale`, the paper's 0.25).
  static constexpr float kScale = 0.25f;

 protected:
  std::vector<StateSpec> whole_state() const override { return specs_; }
  int64_t state_position(size_t i, int64_t x) const override;
  void update(const Piece& piece, Tensor& w, const Tensor& g, float lr,
              float grad_scale) override;

 private:
  bool eight_bit() const { return quant_ != nullptr; }
  // Element boundary x of the layout in the moments' layout (moments_): a projected matrix's
  // start or end only.
  int64_t moment_x(int64_t x) const;
  void update_plain(const Piece& piece, Tensor& w, const Tensor& g, float lr, float grad_scale);
  void update_matrix(const Piece& piece, Tensor& w, const float* g, float lr, float grad_scale);
  // Adam on the projected gradient R (n values at moment position `at`): R becomes the update
  // step D that W += alpha back(D) applies (-lr sqrt(1 - b2^t) / (1 - b1^t) m / (sqrt(v) + eps)
  // for galore; AdamW8bit's kernel on zero weights for galore8bit).
  void adam_projected(const Piece& piece, float* R, float* D, int64_t n, float lr);

  // The moments' layout: one tensor per parameter, r x max(m, n) values for a projected matrix
  // and the parameter's own otherwise, each from a 64-byte line (galore8bit quantises over it).
  std::unique_ptr<ParamLayout> moments_;
  std::unique_ptr<QuantizedStateLayout> quant_;  // galore8bit
  std::vector<StateSpec> specs_;
  std::vector<QuantizedStateLayout::Part> parts_;  // galore8bit: each moment tensor's part
  QuantizedStateLayout::Moment m_, v_;
  size_t proj_index_ = 0;          // the "proj" tensor's index in specs_
  std::vector<int64_t> proj_at_;   // per parameter: projector values before it
  int64_t proj_total_ = 0, scratch_ = 0;
};

}  // namespace memfit
