// Layout of block-wise quantised optimizer state. See Note [8-bit optimizers] and Note [4-bit
// optimizer].
#include "memfit/optim/quantized_state.h"

#include <algorithm>

#include <fmt/format.h>


namespace memfit {

namespace {
constexpr int64_t kF32Align = 16;  // floats per 64 bytes
int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
}  // namespace

QuantizedStateLayout::QuantizedStateLayout(const ParamLayout& layout, QuantFormat format)
    : layout_(layout), format_(format) {
  for (const ParamInfo& p : layout.params()) {
    if (p.numel >= kMinQuantizedNumel) {
      Slot s{true, blocks_};
      s.rank1 = format_.rank1 && p.shape.rank() == 2;
      const int64_t blocks = (p.numel + format_.block - 1) / format_.block;
      if (s.rank1) {
        s.scale = rowcol_elements_;
        rowcol_elements_ += round_up(p.shape[0] + p.shape[1], kF32Align);
      } else {
        s.scale = absmax_blocks_;
        absmax_blocks_ += blocks;
      }
      slots_.push_back(s);
      blocks_ += blocks;
    } else {
      slots_.push_back({false, f32_elements_});
      f32_elements_ += round_up(p.numel, kF32Align);
    }
  }
  for (int part = 0; part < 4; ++part) {
    auto& next = next_[part];
    next.assign(slots_.size() + 1, static_cast<uint32_t>(slots_.size()));
    for (size_t i = slots_.size(); i-- > 0;)
      next[i] = has(static_cast<Part>(part), slots_[i]) ? static_cast<uint32_t>(i) : next[i + 1];
  }
}

bool QuantizedStateLayout::has(Part part, const Slot& s) const {
  switch (part) {
    case Part::codes: return s.quantized;
    case Part::absmax: return s.quantized && !s.rank1;
    case Part::rowcol: return s.rank1;
    case Part::f32: return !s.quantized;
  }
  return false;
}

int64_t QuantizedStateLayout::code_bytes() const { return blocks_ * block_bytes(); }
int64_t QuantizedStateLayout::absmax_elements() const {
  return round_up(absmax_blocks_, kF32Align);
}

size_t QuantizedStateLayout::bytes() const {
  return static_cast<size_t>(code_bytes()) + static_cast<size_t>(absmax_elements()) * 4 +
         static_cast<size_t>(rowcol_elements_) * 4 + static_cast<size_t>(f32_elements_) * 4;
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
  add(m.absmax, Part::absmax, "absmax", DType::f32, absmax_blocks_ > 0 ? absmax_elements() : 0);
  add(m.rowcol, Part::rowcol, "rowcol", DType::f32, rowcol_elements_);
  add(m.f32, Part::f32, "f32", DType::f32, f32_elements_);
  return m;
}

int64_t QuantizedStateLayout::position(Part part, int64_t x) const {
  const auto& ps = layout_.params();
  // The first tensor of the part that ends after x: x is inside it or before it.
  auto it = std::partition_point(ps.begin(), ps.end(),
                                 [&](const ParamInfo& p) { return p.offset + p.numel <= x; });
  const size_t i = next_[static_cast<int>(part)][static_cast<size_t>(it - ps.begin())];
  if (i < ps.size()) {
    const int64_t inside = std::max<int64_t>(0, x - ps[i].offset);
    const Slot& s = slots_[i];
    switch (part) {
      case Part::codes: return s.offset * block_bytes() + inside * format_.bits / 8;
      case Part::absmax: return s.scale + (inside + format_.block - 1) / format_.block;
      case Part::rowcol: return s.scale;
      case Part::f32: return s.offset + inside;
    }
  }
  switch (part) {
    case Part::codes: return code_bytes();
    case Part::absmax: return absmax_elements();
    case Part::rowcol: return rowcol_elements_;
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
  const Slot& s = slots_[static_cast<size_t>(it - ps.begin())];
  if (s.rank1) return p.offset + p.numel;  // row and column maxima span the whole matrix
  const int64_t step = s.quantized ? format_.block : kF32Align;
  return std::min(p.offset + p.numel, p.offset + round_up(x - p.offset, step));
}

}  // namespace memfit
