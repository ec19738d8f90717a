// The NF4 base's layout and its streamed quantization (nf4_base.h).
#include "memfit/model/nf4_base.h"

#include <algorithm>
#include <array>
#include <numeric>

#include "memfit/core/error.h"

namespace memfit {

namespace {

// The first layout parameter of each block linear (a fused group's first member) by its role.
int slot_of(ParamRole role) {
  switch (role) {
    case ParamRole::attn_qkv_weight:
    case ParamRole::attn_q_weight: return static_cast<int>(LinearSlot::qkv);
    case ParamRole::attn_proj_weight: return static_cast<int>(LinearSlot::attn_out);
    case ParamRole::mlp_fc_weight:
    case ParamRole::mlp_gate_weight: return static_cast<int>(LinearSlot::fc);
    case ParamRole::mlp_proj_weight: return static_cast<int>(LinearSlot::mlp_out);
    default: return -1;  // k, v, up: inside a fused group; norms, biases, embeddings, head
  }
}

}  // namespace

Nf4BaseLayout::Nf4BaseLayout(const ModelConfig& config_in) {
  ModelConfig config = config_in;
  config.finalize();
  const ParamLayout layout(config);
  const int64_t C = config.d_model;
  const std::array<std::array<int64_t, 2>, kLinearSlots> shapes = {
      std::array<int64_t, 2>{config.qkv_width(), C},
      {C, config.attn_width()},
      {config.fc_width(), C},
      {C, int64_t{config.ffn_dim}}};
  for (const ParamInfo& p : layout.params()) {
    const int slot = p.layer >= 0 ? slot_of(p.role) : -1;
    if (slot < 0) continue;
    Nf4Matrix m;
    m.layer = p.layer;
    m.slot = static_cast<LinearSlot>(slot);
    m.rows = shapes[static_cast<size_t>(slot)][0];
    m.cols = shapes[static_cast<size_t>(slot)][1];
    m.layout_offset = p.offset;
    m.at = bytes_;
    bytes_ += kernels::nf4_bytes(m.rows, m.cols);
    numel_ += m.rows * m.cols;
    scratch_bytes_ = std::max(scratch_bytes_, kernels::nf4_quantize_scratch_bytes(m.rows, m.cols));
    matrices_.push_back(m);
  }
  std::stable_sort(matrices_.begin(), matrices_.end(), [](const Nf4Matrix& a, const Nf4Matrix& b) {
    return a.layer != b.layer ? a.layer < b.layer : a.slot < b.slot;
  });
  MEMFIT_CHECK(matrices_.size() == static_cast<size_t>(config.n_layer) * kLinearSlots, "nf4_base",
               "found {} block linear weights in a {}-layer model, want {}", matrices_.size(),
               config.n_layer, config.n_layer * kLinearSlots);
  // The bytes in matrix order (the sort may have moved them: lay them out again).
  bytes_ = 0;
  for (Nf4Matrix& m : matrices_) {
    m.at = bytes_;
    bytes_ += kernels::nf4_bytes(m.rows, m.cols);
  }
}

const Nf4Matrix& Nf4BaseLayout::matrix(int layer, LinearSlot slot) const {
  MEMFIT_CHECK(layer >= 0 && static_cast<size_t>(layer) * kLinearSlots < matrices_.size(),
               "nf4_base", "layer {} of {}", layer, matrices_.size() / kLinearSlots);
  return matrices_[static_cast<size_t>(layer) * kLinearSlots + static_cast<size_t>(slot)];
}

kernels::Nf4Weight Nf4BaseLayout::view(const Tensor& buffer, const Nf4Matrix& m) const {
  MEMFIT_CHECK(buffer.nbytes() >= bytes_, "nf4_base", "a buffer of {} bytes for {}",
               buffer.nbytes(), bytes_);
  return kernels::Nf4Weight::view(static_cast<std::byte*>(buffer.raw_data()) + m.at, m.rows,
                                  m.cols);
}

void nf4_base_quantize(const Nf4BaseLayout& layout, const Tensor& buffer, const Nf4Fill& fill,
                       const Tensor& piece, const Tensor& absmax) {
  MEMFIT_CHECK_DTYPE(piece.dtype() == DType::f32 && absmax.dtype() == DType::f32, "nf4_base",
                     "the piece and the absmax scratch are f32, got {} and {}",
                     dtype_name(piece.dtype()), dtype_name(absmax.dtype()));
  MEMFIT_CHECK(absmax.nbytes() >= layout.quantize_scratch_bytes(), "nf4_base",
               "an absmax scratch of {} bytes, need {}", absmax.nbytes(),
               layout.quantize_scratch_bytes());
  for (const Nf4Matrix& m : layout.matrices()) {
    kernels::Nf4Weight w = layout.view(buffer, m);
    // Rows a piece: a multiple of 64 / gcd(cols, 64), so every piece starts a block.
    const int64_t step = kernels::kNf4Block / std::gcd(m.cols, kernels::kNf4Block);
    const int64_t fit = piece.numel() / m.cols / step * step;
    MEMFIT_CHECK(fit > 0 || piece.numel() >= m.rows * m.cols, "nf4_base",
                 "a piece of {} elements holds no {} rows of {} (layer {})", piece.numel(), step,
                 m.cols, m.layer);
    const int64_t per = fit > 0 ? fit : m.rows;
    Tensor scratch = absmax.view(0, {absmax.numel()});
    for (int64_t r0 = 0; r0 < m.rows; r0 += per) {
      const int64_t k = std::min(per, m.rows - r0);
      const int64_t from = m.layout_offset + r0 * m.cols;
      fill(from, from + k * m.cols, piece.data<float>());
      const Tensor rows = piece.view(0, {k, m.cols});
      kernels::nf4_quantize_rows(rows, r0, w, scratch);
    }
    kernels::nf4_quantize_absmax(scratch, w);
  }
}

}  // namespace memfit
