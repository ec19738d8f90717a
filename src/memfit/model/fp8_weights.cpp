// The stored FP8 working weights' layout and their encoding from the master weights
// (fp8_weights.h, Note [FP8], "Storage").
#include "memfit/model/fp8_weights.h"

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/fp8.h"

namespace memfit {

namespace {

constexpr size_t kAlign = 64;

size_t aligned(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// The slot a parameter starts (the first member of a fused group), -1 for the members that
// extend the matrix before it (k, v, up) and for every other parameter.
int starts_slot(ParamRole role) {
  switch (role) {
    case ParamRole::attn_qkv_weight:
    case ParamRole::attn_q_weight: return static_cast<int>(LinearSlot::qkv);
    case ParamRole::attn_proj_weight: return static_cast<int>(LinearSlot::attn_out);
    case ParamRole::mlp_fc_weight:
    case ParamRole::mlp_gate_weight: return static_cast<int>(LinearSlot::fc);
    case ParamRole::mlp_proj_weight: return static_cast<int>(LinearSlot::mlp_out);
    default: return -1;
  }
}

}  // namespace

Fp8WeightLayout::Fp8WeightLayout(const ParamLayout& layout) {
  for (const ParamInfo& p : layout.params()) {
    if (p.layer < 0 || !is_linear_weight(p.role)) continue;
    const int slot = starts_slot(p.role);
    if (slot < 0) {  // k, v, up: adjacent to the group's first member (ParamLayout)
      MEMFIT_CHECK(!matrices_.empty() && matrices_.back().layer == p.layer &&
                       matrices_.back().layout_offset +
                               matrices_.back().rows * matrices_.back().cols ==
                           p.offset &&
                       matrices_.back().cols == p.shape[1],
                   "fp8_weights", "{} does not extend the fused matrix before it", p.name);
      matrices_.back().rows += p.shape[0];
      continue;
    }
    Fp8Matrix m;
    m.layer = p.layer;
    m.slot = static_cast<LinearSlot>(slot);
    m.rows = p.shape[0];
    m.cols = p.shape[1];
    m.layout_offset = p.offset;
    matrices_.push_back(m);
  }
  size_t at = 0;
  for (size_t i = 0; i < matrices_.size(); ++i) {
    Fp8Matrix& m = matrices_[i];
    MEMFIT_CHECK(i == 0 || matrices_[i - 1].layer < m.layer ||
                     (matrices_[i - 1].layer == m.layer && matrices_[i - 1].slot < m.slot),
                 "fp8_weights", "the block linears of layer {} are out of order", m.layer);
    m.index = i;
    m.at = at;
    at = aligned(at + static_cast<size_t>(m.rows * m.cols));
    numel_ += m.rows * m.cols;
  }
  scales_at_ = at;
}

Tensor Fp8WeightLayout::codes(const Tensor& buffer, const Fp8Matrix& m) const {
  MEMFIT_CHECK(buffer.nbytes() >= bytes(), "fp8_weights", "a buffer of {} bytes for {}",
               buffer.nbytes(), bytes());
  return buffer.view_bytes(m.at, {m.rows, m.cols}, DType::u8);
}

Tensor Fp8WeightLayout::scales(const Tensor& buffer) const {
  MEMFIT_CHECK(buffer.nbytes() >= bytes(), "fp8_weights", "a buffer of {} bytes for {}",
               buffer.nbytes(), bytes());
  return buffer.view_bytes(scales_at_, {static_cast<int64_t>(matrices_.size())}, DType::f32);
}

float fp8_weight_scale(const Tensor& master) {
  return kernels::fp8_scale_pow2(kernels::fp8_amax_via_bf16(master), kernels::Fp8Format::e4m3);
}

void fp8_weight_encode(const Fp8WeightLayout& layout, const Fp8Matrix& m, const Tensor& master,
                       const Tensor& buffer) {
  MEMFIT_CHECK_SHAPE(master.numel() == m.rows * m.cols, "fp8_weights",
                     "master weights of {} values for a ({}, {}) matrix", master.numel(), m.rows,
                     m.cols);
  const float scale = fp8_weight_scale(master);
  layout.scales(buffer).data<float>()[m.index] = scale;
  Tensor codes = layout.codes(buffer, m);
  kernels::fp8_quantize_via_bf16(master, scale, kernels::Fp8Format::e4m3, codes);
}

void fp8_weights_encode(const Fp8WeightLayout& layout, const Tensor& master, int64_t master_begin,
                        ElementRange range, const Tensor& buffer, const Fp8AmaxAgree& agree) {
  std::vector<const Fp8Matrix*> inside;
  for (const Fp8Matrix& m : layout.matrices()) {
    const ElementRange mine{m.layout_offset, m.layout_offset + m.rows * m.cols};
    if (range.intersect(mine).empty()) continue;
    MEMFIT_CHECK(range.contains(mine) && mine.begin >= master_begin &&
                     mine.end <= master_begin + master.numel(),
                 "fp8_weights",
                 "layer {}'s matrix [{}, {}) is not wholly inside [{}, {}) and the master "
                 "weights [{}, {})",
                 m.layer, mine.begin, mine.end, range.begin, range.end, master_begin,
                 master_begin + master.numel());
    inside.push_back(&m);
  }
  auto master_of = [&](const Fp8Matrix& m) {
    return master.view(m.layout_offset - master_begin, {m.rows * m.cols});
  };
  if (!agree) {  // each matrix whole here: its own amax
    for (const Fp8Matrix* m : inside) fp8_weight_encode(layout, *m, master_of(*m), buffer);
    return;
  }
  // A slice of each: the slices' amaxes (fp8_weight_scale's, the bf16 copy's), agreed on.
  std::vector<float> amax(inside.size());
  for (size_t i = 0; i < inside.size(); ++i)
    amax[i] = kernels::fp8_amax_via_bf16(master_of(*inside[i]));
  agree(amax);
  float* scales = layout.scales(buffer).data<float>();
  for (size_t i = 0; i < inside.size(); ++i) {
    const Fp8Matrix& m = *inside[i];
    scales[m.index] = kernels::fp8_scale_pow2(amax[i], kernels::Fp8Format::e4m3);
    Tensor codes = layout.codes(buffer, m);
    kernels::fp8_quantize_via_bf16(master_of(m), scales[m.index], kernels::Fp8Format::e4m3,
                                   codes);
  }
}

}  // namespace memfit
