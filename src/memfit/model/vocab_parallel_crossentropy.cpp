// The vocabulary-parallel cross-entropy: the slice kernels (kernels/cpu/crossentropy_slice.h)
// with the group's collectives between them. Per block of R rows, two collectives: the row
// maxima (R floats, a maximum: exact in any order), then the sums of exponentials with the
// target's logit (2R doubles, added in rank order; the target's logit is non-zero on the one
// rank that holds it, so its sum is that logit exactly). Every rank then holds the same
// statistics and computes the same losses.
#include "memfit/model/vocab_parallel_crossentropy.h"

#include <algorithm>
#include <vector>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/crossentropy_slice.h"
#include "memfit/memory/tensor.h"

namespace memfit {
namespace {

// The statistics of R rows: max, then sum_exp and target_logit side by side (one collective).
struct RowStats {
  explicit RowStats(int64_t R)
      : max(static_cast<size_t>(R)), sums(2 * static_cast<size_t>(R)), rows(static_cast<size_t>(R)) {}
  std::span<double> sum_exp() { return std::span(sums).first(rows); }
  std::span<double> target_logit() { return std::span(sums).subspan(rows); }
  std::vector<float> max;
  std::vector<double> sums;
  size_t rows;
};

// Passes 1 and 2 with their collectives; with `store` the logits hold exp(x - max) after.
RowStats row_stats(TensorGroup& group, Tensor& logits, const Tensor& targets,
                   kernels::VocabSliceView slice, bool store, const Tensor* mask) {
  MEMFIT_CHECK_SHAPE(logits.rank() == 2, "vocab_parallel_crossentropy",
                     "logits must be (R, width), got {}", logits.shape());
  RowStats s(logits.size(0));
  kernels::crossentropy_slice_max(s.max, logits, targets, slice, mask);
  group.all_reduce_max(s.max);
  kernels::crossentropy_slice_sum_exp(s.sum_exp(), s.target_logit(), logits, targets, s.max, slice,
                                      store, mask);
  group.all_reduce_sum(std::span<double>(s.sums));
  return s;
}

}  // namespace

void vocab_parallel_crossentropy_forward(TensorGroup& group, Tensor& losses, const Tensor& logits,
                                         const Tensor& targets, int64_t shard_begin,
                                         int64_t vocab, const Tensor* mask) {
  const kernels::VocabSliceView slice{shard_begin, vocab};
  Tensor read = logits;  // pass 2 without store only reads it
  RowStats s = row_stats(group, read, targets, slice, /*store=*/false, mask);
  kernels::crossentropy_slice_loss(losses, s.max, s.sum_exp(), s.target_logit(), mask);
}

void vocab_parallel_crossentropy_forward_backward(TensorGroup& group, Tensor& losses,
                                                  Tensor& logits, const Tensor& targets,
                                                  int64_t shard_begin, int64_t vocab, float dloss,
                                                  DType round_to, const Tensor* mask) {
  const kernels::VocabSliceView slice{shard_begin, vocab};
  RowStats s = row_stats(group, logits, targets, slice, /*store=*/true, mask);
  kernels::crossentropy_slice_loss(losses, s.max, s.sum_exp(), s.target_logit(), mask);
  kernels::crossentropy_slice_backward(logits, targets, s.sum_exp(), slice, dloss, round_to, mask);
}

}  // namespace memfit
