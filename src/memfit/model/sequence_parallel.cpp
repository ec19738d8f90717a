// Sequence parallelism's rows and moves: views of a rank's rows, and the in-place gathers and
// reduce-scatters over the tensor group (Note [Sequence parallel]).
#include "memfit/model/sequence_parallel.h"

#include <algorithm>
#include <cstddef>
#include <span>

#include "memfit/core/error.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/precision.h"

namespace memfit {

namespace {

std::span<float> floats_of(const Tensor& t, const char* op) {
  MEMFIT_CHECK_DTYPE(t.dtype() == DType::f32 && t.is_contiguous(), op,
                     "sequence parallelism sums contiguous f32 rows, got {} {}",
                     dtype_name(t.dtype()), t.shape());
  return {t.data<float>(), static_cast<size_t>(t.numel())};
}

// A gather copies bits, so a bf16 or f16 tensor (the norms' outputs in half precision) moves as
// the 4-byte words its bytes make: `t`'s elements from `begin`, `count` of them, whose bytes
// must be a whole number of words (an even count of halves: d_model is).
std::span<float> words_of(const Tensor& t, int64_t begin, int64_t count, const char* op) {
  const size_t es = dtype_size(t.dtype());
  MEMFIT_CHECK_DTYPE((es == 4 || es == 2) && t.is_contiguous(), op,
                     "sequence parallelism gathers contiguous f32, bf16 or f16 rows, got {} {}",
                     dtype_name(t.dtype()), t.shape());
  const size_t bytes = static_cast<size_t>(count) * es, at = static_cast<size_t>(begin) * es;
  MEMFIT_CHECK_SHAPE(bytes % 4 == 0 && at % 4 == 0, op,
                     "{} {} elements from {} are not whole 4-byte words", count,
                     dtype_name(t.dtype()), begin);
  auto* base = static_cast<std::byte*>(t.raw_data()) + at;
  return {reinterpret_cast<float*>(base), bytes / 4};
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
  const std::span<float> all = words_of(full, 0, full.numel(), "sequence_gather");
  const int64_t n = sequence_mine(group, full).numel();  // (checks the rows split)
  const std::span<float> mine = words_of(full, group.rank() * n, n, "sequence_gather");
  group.all_gather(std::span<const float>(mine.data(), mine.size()), all);
}

void sequence_gather_from(TensorGroup& group, const Tensor& mine, const Tensor& full) {
  const Tensor place = sequence_mine(group, full);
  MEMFIT_CHECK_SHAPE(place.numel() == mine.numel() && mine.dtype() == full.dtype(),
                     "sequence_gather_from", "a rank's rows {} {} for the whole {} {}",
                     dtype_name(mine.dtype()), mine.shape(), dtype_name(full.dtype()),
                     full.shape());
  const std::span<float> m = words_of(mine, 0, mine.numel(), "sequence_gather_from");
  std::copy(m.begin(), m.end(), words_of(place, 0, place.numel(), "sequence_gather_from").data());
  sequence_gather(group, full);
}

void sequence_scatter_sum(TensorGroup& group, const Tensor& full) {
  const std::span<float> all = floats_of(full, "sequence_scatter_sum");
  const Tensor mine = sequence_mine(group, full);
  group.reduce_scatter_sum(all, {mine.data<float>(), static_cast<size_t>(mine.numel())});
}

}  // namespace memfit
