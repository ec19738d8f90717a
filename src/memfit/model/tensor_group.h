// The ranks that split one layer between them (tensor parallelism), as the model sees them: the
// few collectives its layers issue (the vocabulary-parallel cross-entropy's statistics, the
// row- and column-parallel linears' sums), behind an interface of model/'s own, so model code
// calls them without including dist/ (core < ... < model < ... < dist). dist/ implements it over
// the grid's tensor communicator (dist/communicator_tensor_group.h); make_single_tensor_group()
// is one process, where every collective leaves the data as it is.
//
// Every collective is deterministic and gives every rank the same bits: sums add the ranks'
// values element by element in rank order, ((x_0 + x_1) + x_2) + ..., as the Communicator's do
// (Note [Deterministic reduction] in docs/notes/zero.md). Every rank of the group must issue the
// same collectives, with the same lengths, in the same order. Note [Tensor group] in
// docs/notes/tensor-parallel.md.
#pragma once

#include <functional>
#include <memory>
#include <span>

namespace memfit {

class TensorGroup {
 public:
  virtual ~TensorGroup() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data = the sum over the group's ranks, in rank order, on every rank.
  virtual void all_reduce_sum(std::span<float> data) = 0;
  // The same in double (statistics that must not lose the plain kernel's double sums).
  virtual void all_reduce_sum(std::span<double> data) = 0;
  // data = the element-wise largest over the group's ranks, on every rank (exact in any order).
  virtual void all_reduce_max(std::span<float> data) = 0;
  // out (size() * in.size() floats) = every rank's `in`, in rank order, on every rank. `in` may
  // be this rank's place in `out` (in place: sequence parallelism's gathers).
  virtual void all_gather(std::span<const float> in, std::span<float> out) = 0;
  // out (in.size() / size() floats) = the sum over the group, in rank order, of every rank's
  // rank()-th equal part of `in`; `out` may be that part of `in` (sequence parallelism's
  // reduce-scatters, Note [Sequence parallel]). The sums are all_reduce_sum's, bit for bit.
  virtual void reduce_scatter_sum(std::span<const float> in, std::span<float> out) = 0;

  // --tp-overlap (Note [Tensor parallel], "Overlap"): start(collectives) runs `collectives`
  // (calls of this group's collectives, nothing else) on the group's communication thread and
  // returns at once, where overlaps(); finish() waits for them and rethrows what they threw.
  // Between the two the caller computes and communicates nothing (no collective of any group,
  // no MPI call), and touches none of the collectives' data. Without overlap, start() runs them
  // at once and finish() does nothing: the same collectives, in the same order, on the same data.
  virtual bool overlaps() const { return false; }
  virtual void start(const std::function<void()>& collectives) { collectives(); }
  virtual void finish() {}
};

// One process: the sums and maxima are the data itself; the gather a copy.
std::unique_ptr<TensorGroup> make_single_tensor_group();

}  // namespace memfit
