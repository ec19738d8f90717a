// The offload files' layout and the staging ring's size (offload_layout.h).
#include "memfit/offload/offload_layout.h"

#include "memfit/memory/pool.h"
#include "memfit/state/shard.h"

namespace memfit::offload {

OffloadLayout make_offload_layout(const ParamLayout& layout, const Optimizer& whole, bool master,
                                  int64_t max_piece, std::optional<ElementRange> range) {
  OffloadLayout L;
  L.range = range.value_or(whole_range(layout));
  for (const ElementRange& unit : unit_ranges(layout)) {
    const ElementRange u = unit.intersect(L.range);
    if (u.empty()) continue;
    int64_t at = u.begin;
    while (u.end - at > max_piece) {
      const int64_t cut = whole.next_cut(at + max_piece);
      if (cut >= u.end) break;
      L.pieces.push_back({at, cut});
      at = cut;
    }
    L.pieces.push_back({at, u.end});
  }
  if (master) {
    OffloadTensor t{"master", DType::f32, layout.total(), Category::master, {}, {}, 0, 0};
    t.extents = L.pieces;
    L.tensors.push_back(std::move(t));
  }
  const std::vector<StateSpec>& specs = whole.whole_state_specs();
  const size_t first_state = L.tensors.size();
  for (const StateSpec& s : specs)
    L.tensors.push_back({s.name, s.dtype, s.numel, Category::optimizer, {}, {}, 0, 0});
  for (const ElementRange& u : L.pieces) {
    const std::vector<ElementRange> ex = whole.state_extents(u);
    for (size_t i = 0; i < specs.size(); ++i) L.tensors[first_state + i].extents.push_back(ex[i]);
  }
  for (OffloadTensor& t : L.tensors) {
    // Each piece's extent at its own aligned offset, so a piece's rounded-out write never
    // touches its neighbours' bytes (no read-modify-write, no ordering between writes).
    uint64_t at = kHeaderBytes;
    for (size_t u = 0; u < L.pieces.size(); ++u) {
      t.file_offsets.push_back(at);
      const size_t b = align_up(t.extent_bytes(u));
      at += b;
      t.slot_bytes = std::max(t.slot_bytes, b);
    }
    t.file_bytes = at;
    L.slot_bytes += t.slot_bytes;
  }
  return L;
}

OffloadLayout make_offload_layout(const ParamLayout& layout, const OptimConfig& optim,
                                  bool master, int64_t max_piece,
                                  std::optional<ElementRange> range) {
  return make_offload_layout(layout, *make_optimizer(optim, layout, nullptr), master, max_piece,
                             range);
}

size_t OffloadLayout::staging_bytes() const {
  return MemoryPool::round_up(kRingSlots * slot_bytes + kIoAlign);
}

CategoryBytes OffloadLayout::disk_bytes() const {
  CategoryBytes b{};
  for (const OffloadTensor& t : tensors) b[static_cast<size_t>(t.category)] += t.file_bytes;
  return b;
}

uint64_t OffloadLayout::disk_total() const {
  uint64_t b = 0;
  for (const OffloadTensor& t : tensors) b += t.file_bytes;
  return b;
}

uint64_t OffloadLayout::io_bytes_per_step() const {
  uint64_t b = 0;
  for (const OffloadTensor& t : tensors) b += 2 * (t.file_bytes - kHeaderBytes);
  return b;
}

size_t OffloadLayout::slot_offset(int slot, size_t tensor) const {
  size_t at = static_cast<size_t>(slot) * slot_bytes;
  for (size_t i = 0; i < tensor; ++i) at += tensors[i].slot_bytes;
  return at;
}

}  // namespace memfit::offload
