// Sequence parallelism's rows and moves: views of a rank's rows, and the in-place gathers and
// reduce-scatters over the tensor group (Note [Sequence parallel]).
#include "memfit/model/sequence_parallel.h"

#include <algorithm>
#include <span>

#include "memfit/core/error.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/precision.h"

namespace memfit {

namespace {

std::span<float> floats_of(const Tensor& t, const char* op) {
  MEMFIT_CHECK_DTYPE(t.dtype() == DType::f32 && t.is_contiguous(), op,
                     "sequence parallelism moves contiguous f32 rows, got {} {}",
                     dtype_name(t.dtype()), t.shape());
  return {t.data<float>(), static_cast<size_t>(t.numel())};
}

}  // namespace

bool sequence_parallel(const ModelConfig& config, const ActivationOptions& options) {
  return options.sequence_parallel && config.tp > 1;
}

int64_t sequence_rows(const ModelConfig& config, const ActivationOptions& options, int64_t rows) {
  return sequence_parallel(config, options) ? rows / config.tp : rows;
}

void check_sequence_parallel(const ModelConfig& config, const ActivationOptions& options,
                             int seq_len) {
  if (!sequence_parallel(config, options)) return;
  if (seq_len % config.tp != 0)
    MEMFIT_THROW(ConfigError, "config",
                 "--sp splits the sequence over the --tp {} ranks: --seq-len {} must divide by "
                 "{} ({} tokens left over)",
                 config.tp, seq_len, config.tp, seq_len % config.tp);
  if (options.precision != Precision::fp32)
    MEMFIT_THROW(ConfigError, "config",
                 "--sp with --precision {} is not built: sequence parallelism gathers and "
                 "reduce-scatters f32 rows (Note [Sequence parallel])",
                 precision_name(options.precision));
}

bool sequence_partial(ParamRole role) {
  return role == ParamRole::norm_weight || role == ParamRole::norm_bias;
}

Tensor sequence_mine(const TensorGroup& group, const Tensor& full) {
  const int64_t C = full.size(full.rank() - 1), N = full.numel() / C, T = group.size();
  MEMFIT_CHECK_SHAPE(N % T == 0, "sequence_parallel", "{} rows of {} do not split over {} ranks",
                     N, full.shape(), T);
  const int64_t n = N / T;
  return full.view(group.rank() * n * C, {n, C});
}

void sequence_gather(TensorGroup& group, const Tensor& full) {
  const std::span<float> all = floats_of(full, "sequence_gather");
  const Tensor mine = sequence_mine(group, full);
  group.all_gather(std::span<const float>(mine.data<float>(), static_cast<size_t>(mine.numel())),
                   all);
}

void sequence_gather_from(TensorGroup& group, const Tensor& mine, const Tensor& full) {
  const std::span<const float> m = floats_of(mine, "sequence_gather_from");
  const Tensor place = sequence_mine(group, full);
  MEMFIT_CHECK_SHAPE(place.numel() == mine.numel(), "sequence_gather_from",
                     "a rank's rows {} for the whole {}", mine.shape(), full.shape());
  std::copy(m.begin(), m.end(), place.data<float>());
  sequence_gather(group, full);
}

void sequence_scatter_sum(TensorGroup& group, const Tensor& full) {
  const std::span<float> all = floats_of(full, "sequence_scatter_sum");
  const Tensor mine = sequence_mine(group, full);
  group.reduce_scatter_sum(all, {mine.data<float>(), static_cast<size_t>(mine.numel())});
}

}  // namespace memfit
