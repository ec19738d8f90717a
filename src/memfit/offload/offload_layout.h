// Where NVMe offload puts each piece of the model state: one scratch file per offloaded tensor
// (the FP32 master weights where the precision keeps them, then each optimizer state tensor),
// each unit's extent of that tensor at a 4 KiB-aligned offset in its file, and the ring of
// staging buffers the update streams the units through. The engine and the planner both read
// this, so the staging bytes, the disk bytes and the I/O per step are one computation.
// Note [NVMe offload] (docs/notes/offload.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/memory/category.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/optimizer.h"
#include "memfit/core/element_range.h"

namespace memfit::offload {

// O_DIRECT wants buffers, offsets and sizes aligned to the logical block; 4 KiB covers every
// NVMe and 512-byte disk.
inline constexpr size_t kIoAlign = 4096;
inline size_t align_up(size_t b) { return (b + kIoAlign - 1) / kIoAlign * kIoAlign; }
// Each file starts with one page of header (scratch_file.h).
inline constexpr uint64_t kHeaderBytes = kIoAlign;
// Staging slots: piece k+1 being read, piece k being updated, piece k-1 being written.
inline constexpr int kRingSlots = 3;
// The update streams each unit (embeddings, a block, the tail) in pieces of at most this many
// elements, cut where the optimizer's state allows (Optimizer::next_cut), so the ring holds
// three pieces rather than three of the largest block: 8 M elements (32 MiB of master weights,
// one request large enough to run a disk at full speed), so for llama2-7b with 8-bit AdamW and
// master weights a ring of about 150 MiB instead of 3.5 GiB for three blocks.
inline constexpr int64_t kMaxPieceElements = int64_t{1} << 23;

struct OffloadTensor {
  std::string name;   // "master", or the optimizer's state name ("m", "v.codes")
  DType dtype;
  int64_t numel = 0;  // of the whole tensor
  Category category;  // master or optimizer: what it would be in RAM
  // Per piece: the piece's elements of this tensor, and where they start in the file (aligned).
  std::vector<ElementRange> extents;
  std::vector<uint64_t> file_offsets;
  uint64_t file_bytes = 0;  // header and every piece's aligned extent
  size_t slot_bytes = 0;    // the largest piece's extent, aligned: its share of a ring slot

  size_t extent_bytes(size_t piece) const {
    return static_cast<size_t>(extents[piece].size()) * dtype_size(dtype);
  }
};

struct OffloadLayout {
  ElementRange range;  // what is offloaded: the whole layout, or a ZeRO rank's shard
  // unit_ranges(layout) inside `range`, each cut into pieces of at most max_piece elements, in
  // order.
  std::vector<ElementRange> pieces;
  std::vector<OffloadTensor> tensors;  // master (if offloaded), then the state in state_specs order
  size_t slot_bytes = 0;              // one piece of every tensor, each part aligned

  // The ring as the pool counts it: kRingSlots slots and one page to align the start.
  size_t staging_bytes() const;
  // The files' bytes by category (master, optimizer).
  CategoryBytes disk_bytes() const;
  uint64_t disk_total() const;
  // Bytes read and written by one optimizer step (every piece of every file, aligned, both ways).
  uint64_t io_bytes_per_step() const;
  // Tensor i's part of ring slot s, as a byte offset into the ring's aligned start.
  size_t slot_offset(int slot, size_t tensor) const;
};

// The layout for the state of `range` of `layout` (the whole layout when absent; a range must
// start and end where the state can be cut, as shard_ranges' do) of the optimizer `whole` over
// the whole layout (its state specs and extents per piece), with the FP32 master weights first
// when `master`. The files hold only the range's pieces.
OffloadLayout make_offload_layout(const ParamLayout& layout, const Optimizer& whole, bool master,
                                  int64_t max_piece = kMaxPieceElements,
                                  std::optional<ElementRange> range = std::nullopt);
// The same from the config (the planner's entry: no optimizer to hand).
OffloadLayout make_offload_layout(const ParamLayout& layout, const OptimConfig& optim,
                                  bool master, int64_t max_piece = kMaxPieceElements,
                                  std::optional<ElementRange> range = std::nullopt);

}  // namespace memfit::offload
