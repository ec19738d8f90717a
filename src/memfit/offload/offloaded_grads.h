// --offload-grads nvme (one process): the f32 gradients never whole in RAM. Each unit of the
// layout (unit_ranges in model/param_layout.h: the embeddings, each block, the tail) has a buffer
// only while its backward runs; when a block's backward ends its gradients are written to a scratch
// file (io_uring / O_DIRECT from an aligned buffer, in flight while the next block computes), and
// its slot is reused once the write is done. Micro-batch m > 0 of a step reads the block back
// into its slot before its backward (prefetched one block ahead), since the backward kernels
// add into the gradients as they do into the slab in RAM: the same additions in the same
// order, so the same bits. The embeddings and the tail keep a buffer for the whole step (GPT-2's
// tied head writes the embedding gradient in the forward) and are written after the step's
// last backward. The last backward also takes each unit's check (finite, sum of squares,
// unscaled first with a loss scale) for the global norm, in the same per-unit order the update
// in RAM uses (update.cpp). The offloaded update (OffloadedOptimizer::step) reads the gradients
// piece by piece through a ring of three slots, which reuses the backward's buffers.
// With --grad-dtype bf16 the file holds the bf16 sums (half the bytes and the I/O) and each
// micro-batch's backward computes from zero into its f32 buffers, which are rounded to bf16 when
// the unit ends and, from micro-batch 1 on, added to the sums so far (read back, in f32, rounded
// once): UnitGrads' sums in one process, bit for bit (Note [Gradients in bf16]).
// Note [NVMe offload], "Gradients on disk" (docs/notes/offload.md).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/memory/pool.h"
#include "memfit/model/grad_store.h"
#include "memfit/model/param_layout.h"
#include "memfit/offload/io_engine.h"
#include "memfit/offload/offload_layout.h"
#include "memfit/offload/offloaded_optimizer.h"
#include "memfit/offload/scratch_file.h"

namespace memfit::offload {

// Where each unit's gradients lie in the file and what the RAM holds: the engine and the
// planner read this one computation.
struct GradFileLayout {
  DType dtype = DType::f32;              // the sums' type in the file (--grad-dtype)
  std::vector<ElementRange> units;       // unit_ranges(layout)
  std::vector<uint64_t> file_offsets;    // each unit's start, aligned
  uint64_t file_bytes = 0;               // the header and every unit's aligned extent
  size_t edge_bytes = 0, tail_bytes = 0; // the embeddings' and the tail's buffers, aligned
  size_t slot_bytes = 0;                 // one block's buffer, aligned
  int block_slots = 2;                   // f32: 3 with gradient accumulation (a read prefetched)
  // bf16 with accumulation: the edges' sums so far (bf16, RAM for the step), and one block's
  // sums so far read back (bf16) while the block's backward computes into its f32 slot.
  size_t edge_sums_bytes = 0, tail_sums_bytes = 0, read_bytes = 0;
  size_t update_slot_bytes = 0;          // the update's slot: its largest piece, one page more
  int grad_accum = 1;

  // The one pool allocation (Category::grads): the backward's buffers or the update's ring,
  // whichever is larger (never both at once), and a page to align its start.
  size_t ram_bytes() const;
  // One unit's extent in the file (its sums in dtype, rounded to pages).
  size_t unit_file_bytes(size_t unit) const;
  // Bytes from unit u's start in the file to element e's.
  uint64_t file_offset_of(int64_t e) const;
  // Bytes of the file the update reads for `piece` (inside one unit; rounded out to pages).
  uint64_t piece_read_bytes(const ElementRange& piece) const;
  // The backward's bytes per step: each block written by every micro-batch and the edges by
  // the last; each block read back by micro-batches 1...
  uint64_t backward_written() const;
  uint64_t backward_read() const;
  // Bytes written and read per step: the backward's, and every piece read by the update.
  uint64_t io_bytes_per_step(const std::vector<ElementRange>& pieces) const;
  // Which unit holds element `e`.
  size_t unit_of(int64_t e) const;
};

GradFileLayout make_grad_file_layout(const ParamLayout& layout, int grad_accum,
                                     DType dtype = DType::f32,
                                     int64_t max_piece = kMaxPieceElements);

class OffloadedGrads final : public GradStore {
 public:
  // Creates "<run>.grads.offload" in `dir` (IoError when the disk is too small, before
  // anything exists) and the buffers (Category::grads).
  OffloadedGrads(const ParamLayout& layout, MemoryPool& pool, const std::filesystem::path& dir,
                 const std::string& run, int grad_accum, DType dtype = DType::f32,
                 int64_t max_piece = kMaxPieceElements);
  ~OffloadedGrads() override;

  // GradStore.
  const ModelWeights& views() const override { return views_; }
  void zero() override;
  void begin_micro_batch() override;
  void enter_backward(int layer) override;
  void done(int part) override;
  const std::vector<UnitGradCheck>& unit_checks() const override { return checks_; }

  // The step's loss scale's inverse, for the unscale the last backward does (fp16), or none.
  void set_unscale(std::optional<float> inv_scale) { inv_scale_ = inv_scale; }

  // The update's reads: `piece` (inside one unit) into update slot `slot` (0..kRingSlots-1),
  // then its gradients once read (f32, or bf16: the optimizer widens them, set_grad_widen).
  void submit_piece(const ElementRange& piece, int slot);
  Tensor wait_piece(const ElementRange& piece, int slot);

  const GradFileLayout& file_layout() const { return fl_; }
  const ScratchFile& file() const { return *file_; }
  const IoStats& stats() const { return stats_; }
  // Of stats(): the bytes the backward wrote and read back (the rest is the update's reads).
  uint64_t backward_bytes() const { return stats_.bytes_read + stats_.bytes_written - update_read_; }
  // Header's step after an update.
  void set_step(int64_t step) { file_->set_step(step); }

 private:
  char* base() const;
  Tensor at(size_t offset, int64_t n, DType dtype = DType::f32) const;  // a view at base() + offset
  uint64_t submit(IoRequest::Op op, size_t unit, char* buffer);
  void wait(std::vector<uint64_t>& tickets);
  void check(size_t unit, Tensor g);
  char* block_buffer(int slot) const;
  char* edge_sums_buffer() const;  // bf16 with accumulation: the edges' sums so far
  char* read_buffer() const;       // bf16 with accumulation: a block's sums so far, read back
  // bf16: a unit's f32 buffer rounded into its first half, added to the sums so far after the
  // first micro-batch, checked after the last; returns the bf16 sums.
  uint16_t* sum_bf16(size_t unit, char* buffer, const uint16_t* so_far);
  bool bf16() const { return fl_.dtype == DType::bf16; }
  bool last() const { return m_ + 1 == fl_.grad_accum; }

  const ParamLayout layout_;  // its own copy: made before the model
  GradFileLayout fl_;
  std::unique_ptr<IoEngine> io_;
  std::unique_ptr<ScratchFile> file_;
  Tensor buffer_;
  size_t base_ = 0;  // bytes from buffer_'s start to its first aligned byte
  ModelWeights views_;
  std::vector<std::vector<uint64_t>> slot_writes_, slot_reads_;
  std::vector<int> slot_read_of_;  // the block each slot's read is for (-1: none)
  std::vector<uint64_t> edge_writes_;
  std::vector<uint64_t> sums_read_;  // bf16: the block's sums so far, into the read buffer
  std::vector<std::vector<uint64_t>> update_reads_;
  std::vector<UnitGradCheck> checks_;
  std::optional<float> inv_scale_;
  int m_ = -1;
  IoStats stats_;
  uint64_t update_read_ = 0;
};

}  // namespace memfit::offload
