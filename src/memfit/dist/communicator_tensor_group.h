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

 private:
  Communicator& comm_;
};

}  // namespace memfit::dist
