// Where block-wise 8-bit optimizer state lives over a parameter layout, shared by the 8-bit
// optimizers (AdamW8bit: m and v; Lion8bit: m). Tensors of at least kMinQuantizedNumel values get
// 8-bit codes and one absmax per 256-value block; smaller ones keep FP32 state, as bitsandbytes'
// min_8bit_size. One moment is up to three state tensors: "<m>.codes" (i8, 256 per block),
// "<m>.absmax" (f32, one per block) and "<m>.f32" (the small tensors). See Note [8-bit
// optimizers] and, for ranges and extents, Note [Model state].
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "memfit/model/param_layout.h"
#include "memfit/optim/optimizer.h"

namespace memfit {

inline constexpr int64_t kMinQuantizedNumel = 4096;

// Computed from the layout alone, so the planner can size the state without allocating it.
class QuantizedStateLayout {
 public:
  struct Slot {
    bool quantized;
    // quantized: first block (codes start at block * 256); else first element of the f32 slab.
    int64_t offset;
  };
  enum class Part : uint8_t { codes, absmax, f32 };

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

  // Indices into an optimizer's state tensors of one moment's parts (-1: absent).
  struct Moment {
    int codes = -1, absmax = -1, f32 = -1;
  };
  // Appends one moment's state tensors, named "<prefix>.codes|absmax|f32", the empty ones left
  // out, with the part of each to `parts`; returns where they went.
  Moment append_specs(std::string_view prefix, std::vector<StateSpec>& specs,
                      std::vector<Part>& parts) const;
  // Where element boundary x of the layout falls in a part's tensor (Optimizer::state_position):
  // inside a tensor of that part, its slot plus the elements (codes, f32) or blocks (absmax)
  // before x; elsewhere, the slot of the next tensor of that part, or the part's end.
  int64_t position(Part part, int64_t x) const;
  // The first cut at or after x the state allows (Optimizer::next_cut): inside a quantised
  // tensor a multiple of 256 from its start, inside a small one a multiple of 16; never past
  // the tensor's end.
  int64_t next_cut(int64_t x) const;

 private:
  const ParamLayout& layout_;
  std::vector<Slot> slots_;
  // next_[q][i]: the first tensor at or after i that is quantised (q = 1) or not (q = 0);
  // params().size() where none is. position() is called for every piece of every offload
  // layout a search plans, and a scan to the next tensor of the part went to the end of the
  // layout where the part has no tensor after x (perf: 12% of a --max-model search at llama2-7b).
  std::vector<uint32_t> next_[2];
  int64_t blocks_ = 0, f32_elements_ = 0;
};

}  // namespace memfit
