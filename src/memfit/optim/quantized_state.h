// One optimizer moment held as block-wise 8-bit state over a parameter layout, shared by the
// 8-bit optimizers (AdamW8bit: m and v; Lion8bit: m). Tensors of at least kMinQuantizedNumel
// values get 8-bit codes and one absmax per 256-value block; smaller ones keep FP32 state, as
// bitsandbytes' min_8bit_size. See Note [8-bit optimizers].
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "memfit/core/tensor.h"
#include "memfit/memory/pool.h"
#include "memfit/model/param_layout.h"

namespace memfit {

inline constexpr int64_t kMinQuantizedNumel = 4096;

// Where each parameter's state lives: computed from the layout alone, so the planner can size
// the state without allocating it.
class QuantizedStateLayout {
 public:
  struct Slot {
    bool quantized;
    // quantized: first block (codes start at block * 256); else first element of the f32 slab.
    int64_t offset;
  };

  explicit QuantizedStateLayout(const ParamLayout& layout);

  const Slot& slot(size_t param_index) const { return slots_[param_index]; }
  // Blocks over all quantised tensors; each tensor starts on a block, so the codes slab is
  // blocks() * 256 bytes.
  int64_t blocks() const { return blocks_; }
  int64_t code_bytes() const;
  // absmax values allocated: blocks() rounded up to 16 (whole 64-byte lines).
  int64_t absmax_elements() const;
  // FP32 state elements of the small tensors, each starting 64-byte aligned.
  int64_t f32_elements() const { return f32_elements_; }
  // Bytes of one moment: codes + absmax + f32 (each a multiple of 64, so also the pool's count).
  size_t bytes() const;

 private:
  std::vector<Slot> slots_;
  int64_t blocks_ = 0, f32_elements_ = 0;
};

// One moment's slabs (Category::optimizer); an empty part is left undefined.
struct QuantizedState {
  Tensor codes;   // i8, code_bytes()
  Tensor absmax;  // f32, absmax_elements()
  Tensor f32;     // f32, f32_elements()

  QuantizedState(const QuantizedStateLayout& layout, MemoryPool& pool, std::string_view tag);
  // Views for parameter p at slot s.
  Tensor codes_for(const ParamInfo& p, const QuantizedStateLayout::Slot& s) const;
  Tensor absmax_for(const ParamInfo& p, const QuantizedStateLayout::Slot& s) const;
  Tensor f32_for(const ParamInfo& p, const QuantizedStateLayout::Slot& s) const;
  // Appends the defined slabs as "<prefix>.codes", "<prefix>.absmax", "<prefix>.f32".
  void append_state(std::string_view prefix,
                    std::vector<std::pair<std::string, Tensor>>& out) const;
  size_t bytes() const;
};

}  // namespace memfit
