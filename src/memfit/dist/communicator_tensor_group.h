// The model's TensorGroup (model/tensor_group.h) over a communicator: the process grid's tensor
// group (ProcessGrid::tensor()) in a run, any communicator in tests. Float sums are the
// communicator's all-reduce (rank order, Note [Deterministic reduction]); double sums and maxima
// are an all-gather of every rank's values followed by the same reduction on every rank, in rank
// order, so every rank holds the same bits. Note [Tensor group] in docs/notes/tensor-parallel.md.
//
// Every collective goes through one receive buffer of a fixed size (Category::comm, "tp.receive",
// from the run's pool; the planner counts it with tensor_group_buffer_bytes), a chunk at a time:
// each element's sum adds the same values in the same order whatever the chunks, so the bits do
// not depend on them. A reduce-scatter's chunks first gather each rank's part of the chunk side by
// side into a second buffer ("tp.pack", with --sp only). A group built without a pool (tests)
// holds the same buffers on the heap.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "memfit/dist/comm_thread.h"
#include "memfit/dist/communicator.h"
#include "memfit/memory/pool.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/tensor_group.h"

namespace memfit::dist {

// Floats a chunk's receive buffer holds (4 MiB): a collective of more goes in chunks.
inline constexpr int64_t kTensorChunkFloats = int64_t{1} << 20;

// The group's buffers in a run of tensor group size `tp` (0 for one rank) with or without --sp
// (which adds the reduce-scatters' packing buffer), whose largest collective is `largest_floats`
// (a micro-batch's residual stream, rows x d_model: a smaller model's buffer is that, not 4 MiB):
// what the pool lends it, rounded as the pool rounds.
int64_t tensor_group_buffer_bytes(int tp, bool sequence_parallel, int64_t largest_floats);

class CommunicatorTensorGroup final : public TensorGroup {
 public:
  // `comm` (the caller keeps it alive) is the group: its ranks are the group's. `chunk_floats`
  // (tests: small, to cut collectives into many chunks) is what one chunk's receive holds.
  explicit CommunicatorTensorGroup(Communicator& comm,
                                   int64_t chunk_floats = kTensorChunkFloats);

  // The buffers from `pool` (Category::comm), as tensor_group_buffer_bytes counts them, at most
  // `largest_floats` (rounded up to the ranks) each; before the first collective. Without it the
  // first collective takes them from the heap. Any size chunks every collective alike.
  void lend_buffers(MemoryPool& pool, bool sequence_parallel, int64_t largest_floats);
  // Gives them back (before the pool ends); a later collective takes heap buffers.
  void release_buffers() { receive_ = pack_ = Tensor{}; }

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void all_reduce_sum(std::span<float> data) override;
  void all_reduce_sum(std::span<double> data) override;
  void all_reduce_max(std::span<float> data) override;
  void all_gather(std::span<const float> in, std::span<float> out) override;
  void reduce_scatter_sum(std::span<const float> in, std::span<float> out) override;

  // --tp-overlap: from here on start() runs its collectives on a communication thread of the
  // group's own (dist/comm_thread.h; MPI must be initialised SERIALIZED: make_world_communicator's
  // `threads`). Nothing for a group of one.
  void start_overlap();
  bool overlaps() const override { return thread_ != nullptr; }
  void start(const std::function<void()>& collectives) override;
  void finish() override;

  // What the collectives covered so far (a group of one issues none): the float all-reduces'
  // bytes and count, the bytes each rank gave the gathers (the double sums' and maxima's
  // values, all_gather's input), and the reduce-scatters' (--sp) input bytes and count. The run
  // logs each step's (plan: tensor_comm_per_step). A collective cut into chunks counts once.
  // `seconds`: the wall time inside the collectives (waiting for the slowest rank included),
  // what an overlap with compute could hide at most. With --tp-overlap, `overlapped_seconds` of
  // them ran on the communication thread while the step computed, and the step waited
  // `waited_seconds` for them in finish(): the step spent seconds - overlapped_seconds +
  // waited_seconds in the collectives (exposed_seconds()).
  struct Volume {
    int64_t all_reduce_bytes = 0, all_reduce_count = 0, gathered_bytes = 0;
    int64_t reduce_scatter_bytes = 0, reduce_scatter_count = 0;
    double seconds = 0, overlapped_seconds = 0, waited_seconds = 0;
    double exposed_seconds() const { return seconds - overlapped_seconds + waited_seconds; }
  };
  const Volume& volume() const { return volume_; }

 private:
  std::span<float> receive();
  std::span<float> pack();
  template <class T, class Reduce>
  void gather_reduce(std::span<T> data, Reduce reduce);

  Communicator& comm_;
  int64_t chunk_;  // a multiple of size(): a chunk's all-reduce receives it whole
  Tensor receive_, pack_;
  std::vector<float> heap_receive_, heap_pack_;
  Volume volume_;
  std::unique_ptr<CommThread> thread_;  // --tp-overlap; last, so it ends first
};

}  // namespace memfit::dist
