// The offload files' layout (Note [NVMe offload]): pieces tile the layout inside the units and
// are no longer than asked where the state allows a cut; every piece of every file starts at
// an aligned offset past the header and the pieces of a file do not overlap; each state
// tensor's extents tile it; the ring, disk and I/O sizes are the sums they claim.
#include "memfit/offload/offload_layout.h"

#include <gtest/gtest.h>

#include "memfit/model/model_config.h"
#include "memfit/state/shard.h"

namespace memfit::offload {
namespace {

void check_layout(const ParamLayout& layout, const OptimConfig& oc, bool master, int64_t max_piece) {
  const OffloadLayout L = make_offload_layout(layout, oc, master, max_piece);
  SCOPED_TRACE(oc.name + (master ? " with master" : "") + " pieces of " + std::to_string(max_piece));
  // Pieces tile [0, total) and never cross a unit boundary.
  int64_t at = 0;
  const std::vector<ElementRange> units = unit_ranges(layout);
  for (const ElementRange& p : L.pieces) {
    EXPECT_EQ(p.begin, at);
    EXPECT_LT(p.begin, p.end);
    bool inside = false;
    for (const ElementRange& u : units) inside |= u.contains(p);
    EXPECT_TRUE(inside) << p.begin << ".." << p.end;
    at = p.end;
  }
  EXPECT_EQ(at, layout.total());
  EXPECT_GE(L.pieces.size(), units.size());
  ASSERT_EQ(L.tensors.size(), (master ? 1u : 0u) + make_optimizer(oc, layout, nullptr)->whole_state_specs().size());
  uint64_t disk = 0, io = 0;
  size_t slot = 0;
  for (const OffloadTensor& t : L.tensors) {
    int64_t e = 0;
    uint64_t file_end = kHeaderBytes;
    size_t largest = 0;
    for (size_t i = 0; i < L.pieces.size(); ++i) {
      EXPECT_EQ(t.extents[i].begin, e) << t.name;
      e = t.extents[i].end;
      EXPECT_EQ(t.file_offsets[i] % kIoAlign, 0u) << t.name;
      EXPECT_EQ(t.file_offsets[i], file_end) << t.name;  // in order, no overlap, no gap
      file_end += align_up(t.extent_bytes(i));
      largest = std::max(largest, align_up(t.extent_bytes(i)));
    }
    EXPECT_EQ(e, t.numel) << t.name;
    EXPECT_EQ(t.file_bytes, file_end) << t.name;
    EXPECT_EQ(t.slot_bytes, largest) << t.name;
    disk += t.file_bytes;
    io += 2 * (t.file_bytes - kHeaderBytes);
    slot += t.slot_bytes;
  }
  EXPECT_EQ(L.disk_total(), disk);
  EXPECT_EQ(L.io_bytes_per_step(), io);
  EXPECT_EQ(L.slot_bytes, slot);
  EXPECT_GE(L.staging_bytes(), kRingSlots * slot + kIoAlign);
  EXPECT_EQ(L.slot_offset(1, 0), slot);
}

TEST(OffloadLayout, PiecesTileAndFilesAreAligned) {
  for (const char* preset : {"gpt2-tiny", "llama-tiny"}) {
    ModelConfig mc = ModelConfig::preset(preset);
    mc.finalize();
    const ParamLayout layout(mc);
    for (const char* optim : {"adamw", "adamw8bit", "lion8bit", "adam-mini", "sgd"})
      for (int64_t piece : {int64_t{1000}, int64_t{5000}, kMaxPieceElements}) {
        OptimConfig oc;
        oc.name = optim;
        oc.n_head = mc.n_head;
        check_layout(layout, oc, true, piece);
        check_layout(layout, oc, false, piece);
      }
  }
}

TEST(OffloadLayout, Llama7bRingIsThreeCappedPieces) {
  ModelConfig mc = ModelConfig::preset("llama2-7b");
  mc.finalize();
  const ParamLayout layout(mc);
  OptimConfig oc;
  oc.name = "adamw8bit";
  oc.n_head = mc.n_head;
  const OffloadLayout L = make_offload_layout(layout, oc, true);
  for (const ElementRange& p : L.pieces) EXPECT_LE(p.size(), kMaxPieceElements + 4096);
  // A slot: 8 M elements of f32 master weights, two 8-bit moments and their absmax.
  EXPECT_LT(L.staging_bytes(), size_t{160} << 20);
  EXPECT_EQ(L.disk_bytes()[static_cast<size_t>(Category::master)] / 4 / 1000000, 6738u);
}

}  // namespace
}  // namespace memfit::offload
