// Where block-wise quantised optimizer state lives over a parameter layout, shared by the 8-bit
// optimizers (AdamW8bit: m and v; Lion8bit: m) and the 4-bit one (AdamW4bit). Tensors of at
// least kMinQuantizedNumel values get codes (8 bits, or 4 bits two a byte) and one absmax per
// block (256 values at 8 bits, 128 at 4); smaller ones keep FP32 state, as bitsandbytes'
// min_8bit_size. With rank-1 scales (AdamW4bit's second moment) a quantised 2-D tensor (R, C)
// has R row maxima and C column maxima instead of absmaxes, so it is cut only whole. One moment
// is up to four state tensors: "<m>.codes" (i8 bytes), "<m>.absmax" (f32, one per block),
// "<m>.rowcol" (f32: each rank-1 tensor's R + C maxima, 64-byte aligned) and "<m>.f32" (the
// small tensors). See Note [8-bit optimizers], Note [4-bit optimizer] and, for ranges and
// extents, Note [Model state].
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

#include "memfit/model/param_layout.h"
#include "memfit/optim/optimizer.h"

namespace memfit {

inline constexpr int64_t kMinQuantizedNumel = 4096;

// How a moment is quantised: values per block, bits per code (8, or 4: two codes a byte, the
// even element in the low nibble), and whether 2-D tensors take rank-1 scales.
struct QuantFormat {
  int64_t block = 256;
  int bits = 8;
  bool rank1 = false;
};

// Computed from the layout alone, so the planner can size the state without allocating it.
class QuantizedStateLayout {
 public:
  struct Slot {
    bool quantized;
    // quantized: first block (codes start at block * block_bytes()); else first element of the
    // f32 slab.
    int64_t offset;
    bool rank1 = false;  // quantized with rank-1 scales (a 2-D tensor under format.rank1)
    // quantized: its first absmax (block-wise) or its first row maximum (rank1).
    int64_t scale = 0;
  };
  enum class Part : uint8_t { codes, absmax, f32, rowcol };

  explicit QuantizedStateLayout(const ParamLayout& layout, QuantFormat format = {});

  const QuantFormat& format() const { return format_; }
  const Slot& slot(size_t param_index) const { return slots_[param_index]; }
  // Bytes of one block's codes.
  int64_t block_bytes() const { return format_.block * format_.bits / 8; }
  // Blocks over all quantised tensors; each tensor starts on a block, so the codes slab is
  // blocks() * block_bytes() bytes.
  int64_t blocks() const { return blocks_; }
  int64_t code_bytes() const;
  // absmax values allocated: the blocks of the block-wise tensors rounded up to 16 (whole
  // 64-byte lines).
  int64_t absmax_elements() const;
  // Row and column maxima of the rank-1 tensors, each tensor's rounded up to 16.
  int64_t rowcol_elements() const { return rowcol_elements_; }
  // FP32 state elements of the small tensors, each starting 64-byte aligned.
  int64_t f32_elements() const { return f32_elements_; }
  // Bytes of one moment: codes + absmax + rowcol + f32 (each a multiple of 64, so also the pool's
  // count).
  size_t bytes() const;

  // Indices into an optimizer's state tensors of one moment's parts (-1: absent).
  struct Moment {
    int codes = -1, absmax = -1, f32 = -1, rowcol = -1;
  };
  // Appends one moment's state tensors, named "<prefix>.codes|absmax|rowcol|f32", the empty ones
  // left out, with the part of each to `parts`; returns where they went.
  Moment append_specs(std::string_view prefix, std::vector<StateSpec>& specs,
                      std::vector<Part>& parts) const;
  // Where element boundary x of the layout falls in a part's tensor (Optimizer::state_position):
  // inside a tensor of that part, its slot plus the bytes (codes), elements (f32) or blocks
  // (absmax) before x, and for rowcol the tensor's start (it is cut only whole); elsewhere, the
  // slot of the next tensor of that part, or the part's end.
  int64_t position(Part part, int64_t x) const;
  // The first cut at or after x the state allows (Optimizer::next_cut): inside a quantised
  // tensor a multiple of the block from its start (a rank-1 tensor: its end), inside a small one
  // a multiple of 16; never past the tensor's end.
  int64_t next_cut(int64_t x) const;

 private:
  bool has(Part part, const Slot& s) const;

  const ParamLayout& layout_;
  QuantFormat format_;
  std::vector<Slot> slots_;
  // next_[part][i]: the first tensor at or after i that has that part; params().size() where
  // none does. position() is called for every piece of every offload layout a search plans, and
  // a scan to the next tensor of the part went to the end of the layout where the part has no
  // tensor after x (perf: 12% of a --max-model search at llama2-7b).
  std::vector<uint32_t> next_[4];
  int64_t blocks_ = 0, absmax_blocks_ = 0, rowcol_elements_ = 0, f32_elements_ = 0;
};

}  // namespace memfit
