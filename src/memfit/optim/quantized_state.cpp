// Layout and slabs of block-wise 8-bit optimizer state. See Note [8-bit optimizers].
#include "memfit/optim/quantized_state.h"

#include <fmt/format.h>

#include "memfit/kernels/cpu/blockwise_quant.h"

namespace memfit {

namespace {
constexpr int64_t kF32Align = 16;  // floats per 64 bytes
int64_t round_up(int64_t n, int64_t m) { return (n + m - 1) / m * m; }
}  // namespace

QuantizedStateLayout::QuantizedStateLayout(const ParamLayout& layout) {
  for (const ParamInfo& p : layout.params()) {
    if (p.numel >= kMinQuantizedNumel) {
      slots_.push_back({true, blocks_});
      blocks_ += kernels::quant_blocks(p.numel);
    } else {
      slots_.push_back({false, f32_elements_});
      f32_elements_ += round_up(p.numel, kF32Align);
    }
  }
}

int64_t QuantizedStateLayout::code_bytes() const { return blocks_ * kernels::kQuantBlock; }
int64_t QuantizedStateLayout::absmax_elements() const { return round_up(blocks_, kF32Align); }

size_t QuantizedStateLayout::bytes() const {
  return static_cast<size_t>(code_bytes()) + static_cast<size_t>(absmax_elements()) * 4 +
         static_cast<size_t>(f32_elements_) * 4;
}

QuantizedState::QuantizedState(const QuantizedStateLayout& layout, MemoryPool& pool,
                               std::string_view tag) {
  if (layout.blocks() > 0) {
    codes = Tensor::empty(pool, {layout.code_bytes()}, DType::i8, Category::optimizer,
                          fmt::format("{}.codes", tag));
    absmax = Tensor::empty(pool, {layout.absmax_elements()}, DType::f32, Category::optimizer,
                           fmt::format("{}.absmax", tag));
  }
  if (layout.f32_elements() > 0)
    f32 = Tensor::empty(pool, {layout.f32_elements()}, DType::f32, Category::optimizer,
                        fmt::format("{}.f32", tag));
}

Tensor QuantizedState::codes_for(const ParamInfo& p, const QuantizedStateLayout::Slot& s) const {
  return codes.view(s.offset * kernels::kQuantBlock, {p.numel});
}
Tensor QuantizedState::absmax_for(const ParamInfo& p, const QuantizedStateLayout::Slot& s) const {
  return absmax.view(s.offset, {kernels::quant_blocks(p.numel)});
}
Tensor QuantizedState::f32_for(const ParamInfo& p, const QuantizedStateLayout::Slot& s) const {
  return f32.view(s.offset, {p.numel});
}

void QuantizedState::append_state(std::string_view prefix,
                                  std::vector<std::pair<std::string, Tensor>>& out) const {
  if (codes.defined()) out.emplace_back(fmt::format("{}.codes", prefix), codes);
  if (absmax.defined()) out.emplace_back(fmt::format("{}.absmax", prefix), absmax);
  if (f32.defined()) out.emplace_back(fmt::format("{}.f32", prefix), f32);
}

size_t QuantizedState::bytes() const {
  size_t b = 0;
  for (const Tensor* t : {&codes, &absmax, &f32})
    if (t->defined()) b += t->nbytes();
  return b;
}

}  // namespace memfit
