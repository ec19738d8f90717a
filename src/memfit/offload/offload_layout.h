// Where NVMe offload puts each piece of the model state: one scratch file per offloaded tensor
// (the FP32 master weights where the precision keeps them, then each optimizer state tensor),
// each unit's extent of that tensor at a 4 KiB-aligned offset in its file, and the ring of
// staging buffers the update streams the units through. The engine and the planner both read
// this, so the staging bytes, the disk bytes and the I/O per step are one computation.
// Note [NVMe offload] (docs/notes/offload.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/memory/category.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/optimizer.h"
#include "memfit/state/element_range.h"

namespace memfit::offload {

// O_DIRECT wants buffers, offsets and sizes aligned to the logical block; 4 KiB covers every
// NVMe and 512-byte disk.
inline constexpr size_t kIoAlign = 4096;
inline size_t align_up(size_t b) { return (b + kIoAlign - 1) / kIoAlign * kIoAlign; }
// Each file starts with one page of header (scratch_file.h).
inline constexpr uint64_t kHeaderBytes = kIoAlign;
// Staging slots: unit k+1 being read, unit k being updated, unit k-1 being written.
inline constexpr int kRingSlots = 3;

struct OffloadTensor {
  std::string name;   // "master", or the optimizer's state name ("m", "v.codes")
  DType dtype;
  int64_t numel = 0;  // of the whole tensor
  Category category;  // master or optimizer: what it would be in RAM
  // Per unit: the unit's elements of this tensor, and where they start in the file (aligned).
  std::vector<ElementRange> extents;
  std::vector<uint64_t> file_offsets;
  uint64_t file_bytes = 0;  // header and every unit's aligned extent
  size_t slot_bytes = 0;    // the largest unit's extent, aligned: its share of a ring slot

  size_t extent_bytes(size_t unit) const {
    return static_cast<size_t>(extents[unit].size()) * dtype_size(dtype);
  }
};

struct OffloadLayout {
  std::vector<ElementRange> units;    // unit_ranges(layout)
  std::vector<OffloadTensor> tensors;  // master (if offloaded), then the state in state_specs order
  size_t slot_bytes = 0;              // one unit of every tensor, each part aligned

  // The ring as the pool counts it: kRingSlots slots and one page to align the start.
  size_t staging_bytes() const;
  // The files' bytes by category (master, optimizer).
  CategoryBytes disk_bytes() const;
  uint64_t disk_total() const;
  // Bytes read and written by one optimizer step (every unit of every file, aligned, both ways).
  uint64_t io_bytes_per_step() const;
  // Tensor i's part of ring slot s, as a byte offset into the ring's aligned start.
  size_t slot_offset(int slot, size_t tensor) const;
};

// The layout for an optimizer over the whole `layout` (its state specs and extents per unit),
// with the FP32 master weights first when `master`.
OffloadLayout make_offload_layout(const ParamLayout& layout, const Optimizer& whole, bool master);
// The same from the config (the planner's entry: no optimizer to hand).
OffloadLayout make_offload_layout(const ParamLayout& layout, const OptimConfig& optim,
                                  bool master);

}  // namespace memfit::offload
