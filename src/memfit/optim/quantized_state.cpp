// Layout of block-wise 8-bit optimizer state. See Note [8-bit optimizers].
#include "memfit/optim/quantized_state.h"

#include <algorithm>

#include <fmt/format.h>

#include "memfit/kernels/cpu/blockwise_quant.h"

namespace memfit {

namespace {
constexpr int64_t kF32Align = 16;  // floats per 64 bytes
int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
}  // namespace

QuantizedStateLayout::QuantizedStateLayout(const ParamLayout& layout) : layout_(layout) {
  for (const ParamInfo& p : layout.params()) {
    if (p.numel >= kMinQuantizedNumel) {
      slots_.push_back({true, blocks_});
      blocks_ += kernels::quant_blocks(p.numel);
    } else {
      slots_.push_back({false, f32_elements_});
      f32_elements_ += round_up(p.numel, kF32Align);
    }
  }
  for (int q = 0; q < 2; ++q) {
    next_[q].assign(slots_.size() + 1, static_cast<uint32_t>(slots_.size()));
    for (size_t i = slots_.size(); i-- > 0;)
      next_[q][i] = slots_[i].quantized == (q == 1) ? static_cast<uint32_t>(i) : next_[q][i + 1];
  }
}

int64_t QuantizedStateLayout::code_bytes() const { return blocks_ * kernels::kQuantBlock; }
int64_t QuantizedStateLayout::absmax_elements() const { return round_up(blocks_, kF32Align); }

size_t QuantizedStateLayout::bytes() const {
  return static_cast<size_t>(code_bytes()) + static_cast<size_t>(absmax_elements()) * 4 +
         static_cast<size_t>(f32_elements_) * 4;
}

QuantizedStateLayout::Moment QuantizedStateLayout::append_specs(std::string_view prefix,
                                                                std::vector<StateSpec>& specs,
                                                                std::vector<Part>& parts) const {
  Moment m;
  auto add = [&](int& index, Part part, const char* name, DType dtype, int64_t numel) {
    if (numel == 0) return;
    index = static_cast<int>(specs.size());
    specs.push_back({fmt::format("{}.{}", prefix, name), dtype, numel});
    parts.push_back(part);
  };
  add(m.codes, Part::codes, "codes", DType::i8, code_bytes());
  add(m.absmax, Part::absmax, "absmax", DType::f32, blocks_ > 0 ? absmax_elements() : 0);
  add(m.f32, Part::f32, "f32", DType::f32, f32_elements_);
  return m;
}

int64_t QuantizedStateLayout::position(Part part, int64_t x) const {
  const auto& ps = layout_.params();
  const bool want_quantized = part != Part::f32;
  // The first tensor of the part that ends after x: x is inside it or before it.
  auto it = std::partition_point(ps.begin(), ps.end(),
                                 [&](const ParamInfo& p) { return p.offset + p.numel <= x; });
  const size_t i = next_[want_quantized ? 1 : 0][static_cast<size_t>(it - ps.begin())];
  if (i < ps.size()) {
    const int64_t inside = std::max<int64_t>(0, x - ps[i].offset);
    switch (part) {
      case Part::codes: return slots_[i].offset * kernels::kQuantBlock + inside;
      case Part::absmax: return slots_[i].offset + kernels::quant_blocks(inside);
      case Part::f32: return slots_[i].offset + inside;
    }
  }
  switch (part) {
    case Part::codes: return code_bytes();
    case Part::absmax: return absmax_elements();
    case Part::f32: return f32_elements_;
  }
  return 0;
}

int64_t QuantizedStateLayout::next_cut(int64_t x) const {
  const auto& ps = layout_.params();
  auto it = std::partition_point(ps.begin(), ps.end(),
                                 [&](const ParamInfo& p) { return p.offset + p.numel <= x; });
  if (it == ps.end()) return layout_.total();
  const ParamInfo& p = *it;
  if (x <= p.offset) return p.offset;
  const int64_t step = slots_[static_cast<size_t>(it - ps.begin())].quantized
                           ? kernels::kQuantBlock
                           : kF32Align;
  return std::min(p.offset + p.numel, p.offset + round_up(x - p.offset, step));
}

}  // namespace memfit
