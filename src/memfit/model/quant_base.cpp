// The quantized base's layout and its streamed quantization (quant_base.h).
#include "memfit/model/quant_base.h"

#include <algorithm>
#include <array>

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

QuantBaseLayout::QuantBaseLayout(const ModelConfig& config_in, kernels::WeightQuant format)
    : format_(format) {
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
    QuantMatrix m;
    m.layer = p.layer;
    m.slot = static_cast<LinearSlot>(slot);
    m.rows = shapes[static_cast<size_t>(slot)][0];
    m.cols = shapes[static_cast<size_t>(slot)][1];
    m.layout_offset = p.offset;
    numel_ += m.rows * m.cols;
    scratch_bytes_ =
        std::max(scratch_bytes_, kernels::quant_quantize_scratch_bytes(format, m.rows, m.cols));
    min_piece_ = std::max(min_piece_, m.cols * kernels::quant_row_step(format, m.cols));
    matrices_.push_back(m);
  }
  std::stable_sort(matrices_.begin(), matrices_.end(),
                   [](const QuantMatrix& a, const QuantMatrix& b) {
                     return a.layer != b.layer ? a.layer < b.layer : a.slot < b.slot;
                   });
  MEMFIT_CHECK(matrices_.size() == static_cast<size_t>(config.n_layer) * kLinearSlots,
               "quant_base", "found {} block linear weights in a {}-layer model, want {}",
               matrices_.size(), config.n_layer, config.n_layer * kLinearSlots);
  // The bytes in matrix order.
  for (QuantMatrix& m : matrices_) {
    m.at = bytes_;
    bytes_ += matrix_bytes(m);
  }
}

size_t QuantBaseLayout::matrix_bytes(const QuantMatrix& m) const {
  return kernels::quant_bytes(format_, m.rows, m.cols);
}

const QuantMatrix& QuantBaseLayout::matrix(int layer, LinearSlot slot) const {
  MEMFIT_CHECK(layer >= 0 && static_cast<size_t>(layer) * kLinearSlots < matrices_.size(),
               "quant_base", "layer {} of {}", layer, matrices_.size() / kLinearSlots);
  return matrices_[static_cast<size_t>(layer) * kLinearSlots + static_cast<size_t>(slot)];
}

kernels::QuantWeight QuantBaseLayout::view(const Tensor& buffer, const QuantMatrix& m) const {
  MEMFIT_CHECK(buffer.nbytes() >= bytes_, "quant_base", "a buffer of {} bytes for {}",
               buffer.nbytes(), bytes_);
  return kernels::QuantWeight::view(format_, static_cast<std::byte*>(buffer.raw_data()) + m.at,
                                    m.rows, m.cols);
}

void quant_base_quantize(const QuantBaseLayout& layout, const Tensor& buffer,
                         const QuantFill& fill, const Tensor& piece, const Tensor& scratch_in) {
  const bool need = layout.quantize_scratch_bytes() > 0;
  MEMFIT_CHECK_DTYPE(piece.dtype() == DType::f32 && (!need || scratch_in.dtype() == DType::f32),
                     "quant_base", "the piece and the scratch are f32, got {} and {}",
                     dtype_name(piece.dtype()), dtype_name(scratch_in.dtype()));
  MEMFIT_CHECK(!need || scratch_in.nbytes() >= layout.quantize_scratch_bytes(), "quant_base",
               "a scratch of {} bytes, need {}", need ? scratch_in.nbytes() : 0,
               layout.quantize_scratch_bytes());
  for (const QuantMatrix& m : layout.matrices()) {
    kernels::QuantWeight w = layout.view(buffer, m);
    // Rows a piece: a multiple of the format's step (NF4: 64 / gcd(cols, 64), so every piece
    // starts a block; int8: any row).
    const int64_t step = kernels::quant_row_step(layout.format(), m.cols);
    const int64_t fit = piece.numel() / m.cols / step * step;
    MEMFIT_CHECK(fit > 0 || piece.numel() >= m.rows * m.cols, "quant_base",
                 "a piece of {} elements holds no {} rows of {} (layer {})", piece.numel(), step,
                 m.cols, m.layer);
    const int64_t per = fit > 0 ? fit : m.rows;
    Tensor scratch = need ? scratch_in.view(0, {scratch_in.numel()}) : Tensor{};
    for (int64_t r0 = 0; r0 < m.rows; r0 += per) {
      const int64_t k = std::min(per, m.rows - r0);
      const int64_t from = m.layout_offset + r0 * m.cols;
      fill(from, from + k * m.cols, piece.data<float>());
      const Tensor rows = piece.view(0, {k, m.cols});
      kernels::quant_quantize_rows(rows, r0, w, scratch);
    }
    kernels::quant_quantize_finish(scratch, w);
  }
}

}  // namespace memfit
