// An optimizer whose state (and the FP32 master weights, where the precision keeps them) lives
// in scratch files on disk (--offload-optimizer nvme). The update streams the layout's units
// (embeddings, each block, the tail; large ones in pieces of kMaxPieceElements) through a ring
// of three staging buffers: piece k+1 is read and piece k-1 written while piece k is updated by
// an optimizer over piece k's range whose state is bound to its staging slot
// (Optimizer::bind_state). Per element it is the in-RAM update,
// so the results are bit-identical. Checkpoints stream the state out of the files and back in
// a unit at a time. With --update-in-backward the same ring streams each unit as the backward
// finishes it (UnitStateStream: offloaded_unit_pass.cpp). Note [NVMe offload]
// (docs/notes/offload.md).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/io/checkpoint/zero_checkpoint.h"
#include "memfit/memory/pool.h"
#include "memfit/model/param_layout.h"
#include "memfit/dist/zero/weight_gather.h"
#include "memfit/offload/io_engine.h"
#include "memfit/offload/offload_layout.h"
#include "memfit/offload/scratch_file.h"
#include "memfit/optim/optimizer.h"
#include "memfit/optim/tensor_split.h"
#include "memfit/optim/unit_steps.h"

namespace memfit::io {
class LayoutStateReader;
}

namespace memfit::offload {

class OffloadedGrads;

// What the I/O cost: bytes moved, the time the update waited for the disk, and the updates'
// whole time (so bytes / update_seconds is the throughput while the optimizer runs).
struct IoStats {
  uint64_t bytes_read = 0, bytes_written = 0;
  double wait_seconds = 0;
  double update_seconds = 0;
};

// One wait of the update on the disk (a profile shows it as an io slice).
struct IoWait {
  std::chrono::steady_clock::time_point t0, t1;
};

class OffloadedOptimizer final : public UnitStateStream {
 public:
  // Creates the files in `dir` (named "<run>.<tensor>.offload") and the staging ring (from
  // `pool`, Category::staging). Refuses a disk too small before creating anything: IoError
  // with the bytes needed and the bytes free. The state starts as a fresh optimizer's (zeros);
  // the master weights must be written (write_master) before the first step.
  // `max_piece`: the longest range streamed at once (tests make it small). `range`: the part of
  // the layout to update (a ZeRO rank's shard, cut where the state allows: shard_ranges), the
  // whole layout when absent.
  OffloadedOptimizer(const OptimConfig& config, const ParamLayout& layout, bool master,
                     MemoryPool& pool, const std::filesystem::path& dir, const std::string& run,
                     int64_t max_piece = kMaxPieceElements,
                     std::optional<ElementRange> range = std::nullopt);
  ~OffloadedOptimizer();

  std::string name() const { return units_.front()->name(); }
  bool has_master() const { return master_; }
  const OffloadLayout& file_layout() const { return layout_; }
  const IoEngine& engine() const { return *io_; }
  const std::vector<std::unique_ptr<ScratchFile>>& files() const { return files_; }

  const ElementRange& range() const { return layout_.range; }

  // The master weights to and from an f32 slab covering range() (init, load, save).
  void write_master(const Tensor& f32_slab);
  void read_master(Tensor& f32_slab);
  // The master weights written a unit at a time from `fill(from, to, dst)`, which puts layout
  // elements [from, to) of range() in f32 straight into the unit's I/O buffer (initial weights
  // drawn, a checkpoint read): no range-sized buffer. Units in increasing order.
  void write_master_from(const std::function<void(int64_t from, int64_t to, float* dst)>& fill);
  // The reverse: `take(from, to, src)` is given each unit's master weights from its buffer.
  void read_master_to(
      const std::function<void(int64_t from, int64_t to, const float* src)>& take);
  // The same for the part of range() inside `want`: each piece that overlaps it read into a
  // ring slot (two slots in turn, the next piece's read in flight while `take` has this one),
  // `take` given the overlap. What a streamed save reads (io/checkpoint/streamed_weights.h): no
  // buffer beyond the ring.
  void read_master_range(
      ElementRange want,
      const std::function<void(int64_t from, int64_t to, const float* src)>& take);

  // One update, as Optimizer::step_master (with master weights: `working` is the bf16 or f16
  // copy, rounded from the updated master) or Optimizer::step (without: `working` is the
  // weights of record, in RAM). `working` and `grads` cover range() (element 0 is
  // range().begin), as Optimizer::step's tensors do.
  void step(Tensor& working, const Tensor& grads, float lr, float grad_scale);
  // The same with the working weights offloaded too (--offload-params; range() the whole
  // layout, or at ZeRO stage 3 the rank's shard, as the file's): each
  // piece's working weights from `working` (WeightGather::update_piece: a persistent unit's in
  // RAM, a block's in a ring slot, read first without master weights), each block written back
  // to its file once its last piece is stepped.
  void step(WeightGather& working, const Tensor& grads, float lr, float grad_scale);
  // Both with the gradients in their file (--offload-grads nvme): each piece's read with its
  // master weights and state, through the gradients' own ring (offloaded_grads.h). Whole
  // layout only (one process).
  void step(Tensor& working, OffloadedGrads& grads, float lr, float grad_scale);
  void step(WeightGather& working, OffloadedGrads& grads, float lr, float grad_scale);
  // bf16 gradients (--grad-dtype bf16): the f32 buffer each piece's optimizer widens them into
  // (Optimizer::set_grad_widen).
  void set_grad_widen(const Tensor& buffer) {
    for (auto& u : units_) u->set_grad_widen(buffer);
  }
  // --tp: the tensor group every piece's optimizer takes where its update groups elements
  // across the slices (Adam-mini, 4-bit AdamW: optim/tensor_split.h).
  void set_tensor_split(const TensorSplit& split) {
    for (auto& u : units_) ::memfit::set_tensor_split(*u, split);
  }
  int64_t steps_taken() const override { return units_.front()->steps_taken(); }
  void set_steps_taken(int64_t t);

  // --update-in-backward (UnitStateStream, optim/unit_steps.h; Note [Update in backward], "With
  // offload"): each unit's pieces stepped as the backward finishes the unit, in the backward's
  // order (the tail, the blocks top down, the embeddings), through the same ring as step(): a
  // unit's pieces read, stepped with the gradients of the unit's buffer and written back, the
  // next two pieces' reads in flight while the backward computes the next unit. The working
  // weights: `working` (range()'s, in RAM), or with --offload-params the slots the backward
  // read them into (WeightGather::stepped_piece), each block written back once stepped. Over
  // range(): the whole layout in one process, or a ZeRO rank's shard (stages 2-3, whose
  // per-unit reduction gives each unit's part as it is reduce-scattered). Before the first pass.
  void attach_backward(const Tensor& working);
  void attach_backward(WeightGather& working);
  void begin_pass() override;
  void step_unit(size_t u, const Tensor& grads, float lr, float scale, int64_t steps,
                 bool step) override;
  void end_pass(int64_t steps) override;

  // optimizer.safetensors as io::save_optimizer_state writes it for the same optimizer in RAM
  // (the same bytes), streamed from the files through the ring. The whole layout only (a
  // shard's state is saved as the sharded checkpoint lays it out).
  void save_state(const std::filesystem::path& file);
  // The reverse: checks the file as io::load_optimizer_state does (IoError listing what does
  // not match), then streams each tensor into its file and restores steps_taken.
  void load_state(const std::filesystem::path& file);

  // ZeRO's sharded checkpoint (io/checkpoint/zero_checkpoint.h) with the state offloaded: this
  // range's shard file as io::save_zero_shard writes it for the same optimizer in RAM (the same
  // bytes), its weights of record then each state slice streamed from the files through the ring.
  // The weights of record: the master weights, streamed from their file (`weights` undefined), or
  // without master weights `weights` (range()'s working weights, in RAM).
  void save_shard(const std::filesystem::path& file, const Tensor& weights = {});
  // The same without master weights and with the working weights offloaded too
  // (--offload-params at stage 3): the weights of record streamed from `working`'s file.
  void save_shard(const std::filesystem::path& file, WeightGather& working);
  // The reverse for any saved state (a ZeRO save of any world size and stage, or a whole
  // optimizer.safetensors), opened and checked for range() (io::SavedOptimizerState): each
  // piece read from the mapped files into a ring slot and written to its file, then
  // steps_taken restored. Bounded RAM: one slot, and the mapping's pages released per tensor.
  void load_state(const io::SavedOptimizerState& saved);
  // The same for a rank of a split layout (--tp, --pp): each piece of each state tensor read
  // through the layout map (the save's whole tensors, any layout's) into a ring slot and
  // written to its file, then steps_taken restored.
  void load_state(const io::LayoutStateReader& saved);
  // State tensor `spec` (a whole state spec's index) streamed out of its file a piece at a
  // time through one ring slot: `take(from, to, src)` is given each piece's state elements
  // [from, to) (Optimizer::state_extents positions). What a split layout's save writes
  // (io::LayoutFiles::Writer).
  void read_state_to(size_t spec,
                     const std::function<void(int64_t from, int64_t to, const void* src)>& take);
  // An optimizer over one piece, without state: what the sharded checkpoint's index and
  // SavedOptimizerState read of it (name, whole state specs, state_extents, steps_taken).
  const Optimizer& descriptor() const { return *units_.front(); }

  const IoStats& stats() const { return stats_; }
  // The files' bytes on disk by category (master, optimizer), stat'ed: what the planner's
  // disk_by_category predicts.
  CategoryBytes file_bytes() const;

  // While on, step() keeps each of its waits on the disk until take_waits() (the trainer turns
  // it on for --profile's window; off, it costs a test per wait).
  void record_waits(bool on) {
    record_waits_ = on;
    if (!on) waits_.clear();
  }
  std::vector<IoWait> take_waits() { return std::exchange(waits_, {}); }

 private:
  // Both load_state overloads: each state tensor streamed from `saved` into the file.
  template <class Saved>
  void load_state_pieces(const Saved& saved);
  // Tensor i of unit u: its part of ring slot s as a typed view, and the file request.
  Tensor slot_view(int slot, size_t tensor, size_t unit) const;
  IoRequest request(IoRequest::Op op, int slot, size_t tensor, size_t unit) const;
  // Reads or writes every tensor of unit u through slot s (tickets in `tickets`).
  void submit_unit(IoRequest::Op op, int slot, size_t unit, std::vector<uint64_t>& tickets);
  // Waits for `tickets`; with `log`, the wait's interval goes into it (unless none was waited for).
  void wait(std::vector<uint64_t>& tickets, std::vector<IoWait>* log = nullptr);
  // Tensor i, unit by unit, through slot 0: each unit's bytes to `f` (read) or from it (write).
  template <class F>
  void stream(size_t tensor, IoRequest::Op op, F&& f);
  void save_shard(const std::filesystem::path& file, const Tensor& weights,
                  WeightGather* working);
  // `grads` in RAM, or `file` (--offload-grads).
  void step_pieces(Tensor* working, WeightGather* pieces, const Tensor* grads,
                   OffloadedGrads* file, float lr, float grad_scale);

  const ParamLayout& params_;
  bool master_;
  OffloadLayout layout_;
  std::unique_ptr<IoEngine> io_;
  std::vector<std::unique_ptr<ScratchFile>> files_;  // one per layout_.tensors entry
  std::vector<std::unique_ptr<Optimizer>> units_;    // one per piece, state bound per step
  Tensor ring_;
  Tensor scratch_;        // APOLLO's scratch in RAM, shared by the pieces (Category::optimizer)
  size_t ring_base_ = 0;  // bytes from ring_'s start to its first aligned byte
  IoStats stats_;
  bool record_waits_ = false;
  std::vector<IoWait> waits_;
  // --update-in-backward's pass: the pieces in the backward's order (pass_pieces_), unit u's
  // first position in it and count (pass_units_), the next position, and the requests in flight
  // per ring slot between step_unit calls. The working weights: in RAM, or the model's slots.
  void order_pass();
  void pass_read(size_t position);
  std::vector<size_t> pass_pieces_;
  std::vector<std::pair<size_t, size_t>> pass_units_;
  size_t pass_next_ = 0;
  bool pass_on_ = false;
  std::vector<uint64_t> pass_reads_[kRingSlots], pass_writes_[kRingSlots];
  Tensor pass_working_;
  WeightGather* pass_gather_ = nullptr;
};

}  // namespace memfit::offload
