// The model's TensorGroup (model/tensor_group.h) over a communicator: the process grid's tensor
// group (ProcessGrid::tensor()) in a run, any communicator in tests. Float sums are the
// communicator's all-reduce (rank order, Note [Deterministic reduction]); double sums and maxima
// are an all-gather of every rank's values followed by the same reduction on every rank, in rank
// order, so every rank holds the same bits. Note [Tensor group] in docs/notes/tensor-parallel.md.
#pragma once

#include "memfit/dist/communicator.h"
#include "memfit/model/tensor_group.h"

namespace memfit::dist {

class CommunicatorTensorGroup final : public TensorGroup {
 public:
  // `comm` (the caller keeps it alive) is the group: its ranks are the group's.
  explicit CommunicatorTensorGroup(Communicator& comm) : comm_(comm) {}

  int rank() const override { return comm_.rank(); }
  int size() const override { return comm_.size(); }
  void all_reduce_sum(std::span<float> data) override;
  void all_reduce_sum(std::span<double> data) override;
  void all_reduce_max(std::span<float> data) override;
  void all_gather(std::span<const float> in, std::span<float> out) override;
  void reduce_scatter_sum(std::span<const float> in, std::span<float> out) override;

  // What the collectives covered so far (a group of one issues none): the float all-reduces'
  // bytes and count, the bytes each rank gave the gathers (the double sums' and maxima's
  // values, all_gather's input), and the reduce-scatters' (--sp) input bytes and count. The run
  // logs each step's (plan: tensor_comm_per_step).
  struct Volume {
    int64_t all_reduce_bytes = 0, all_reduce_count = 0, gathered_bytes = 0;
    int64_t reduce_scatter_bytes = 0, reduce_scatter_count = 0;
  };
  const Volume& volume() const { return volume_; }

 private:
  Communicator& comm_;
  Volume volume_;
};

}  // namespace memfit::dist
