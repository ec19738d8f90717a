// Which optimizers step a tensor-parallel rank's slices as the whole model's; see
// sliced_optimizer.h.
#include "memfit/optim/sliced_optimizer.h"

#include <algorithm>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "memfit/model/param_layout.h"
#include "memfit/model/tensor_slices.h"
#include "memfit/optim/adamw4bit.h"
#include "memfit/optim/quantized_state.h"

namespace memfit {

namespace {

// Block-wise state (AdamW8bit, Lion8bit: 256 values a block; AdamW4bit's first moment and its
// 1-D tensors' second moment: 128): a quantised tensor's blocks are its own elements `block` at
// a time from its start. A rank's blocks are the whole tensor's where each run of the slice
// (model/tensor_slices.h) starts on a block in both tensors and is whole blocks long, or ends
// both tensors; and a slice keeps f32 state exactly where the whole tensor does. Padding rows
// (vocabulary rows beyond the whole table: zeros, whose moments stay 0) need only start on a
// block of the rank's tensor.
std::optional<std::string> blockwise_refusal(const ModelConfig& config, QuantFormat format) {
  const ParamLayout mine(config), whole(whole_model(config));
  const QuantizedStateLayout mine_q(mine, format), whole_q(whole, format);
  const std::string bits = fmt::format("{}-bit", format.bits);
  const int64_t B = mine_q.format().block;
  for (int rank = 0; rank < config.tp; ++rank) {
    // In the rank's layout order, so each tensor's runs are found by a binary search (a
    // row-parallel matrix is a run a row: 1.3M runs a rank at 70B, which every tensor walked in
    // full made 99% of a layout search's time with 8-bit AdamW; perf).
    std::vector<SliceRun> runs = tensor_slice_runs(config, rank);
    std::sort(runs.begin(), runs.end(),
              [](const SliceRun& a, const SliceRun& b) { return a.local < b.local; });
    for (size_t i = 0; i < mine.params().size(); ++i) {
      const ParamInfo& p = mine.params()[i];
      const ParamInfo& w = whole.params()[i];
      if (mine_q.slot(i).quantized != whole_q.slot(i).quantized)
        return fmt::format(
            "rank {}'s slice of {} has {} elements, the whole tensor {}: the slice would keep "
            "{} state where one process keeps {} (at least {} elements are quantised)",
            rank, p.name, p.numel, w.numel, mine_q.slot(i).quantized ? bits : "f32",
            whole_q.slot(i).quantized ? bits : "f32", kMinQuantizedNumel);
      if (!mine_q.slot(i).quantized) continue;
      auto first = std::upper_bound(runs.begin(), runs.end(), p.offset,
                                    [](int64_t at, const SliceRun& r) { return at < r.local; });
      if (first != runs.begin()) --first;  // the run that may start before the tensor
      for (auto it = first; it != runs.end() && it->local < p.offset + p.numel; ++it) {
        const SliceRun& r = *it;
        const int64_t lo = std::max(r.local, p.offset);
        const int64_t hi = std::min(r.local + r.n, p.offset + p.numel);
        if (lo >= hi) continue;
        const int64_t at = lo - p.offset, n = hi - lo;
        const bool padding = r.whole < 0;
        const int64_t from = padding ? 0 : r.whole + (lo - r.local) - w.offset;
        const bool ends = hi == p.offset + p.numel && (padding || from + n == w.numel);
        if (at % B == 0 && (padding || from % B == 0) && (n % B == 0 || ends)) continue;
        return fmt::format(
            "rank {}'s slice of {} {} holds {} elements of the whole tensor {} from its element "
            "{} at its own element {}: not whole {}-value quantisation blocks of both, so its "
            "blocks' absmaxes would be other values' than one process's (another algorithm); "
            "widths whose slices are multiples of {} (e.g. --d-model {} at --tp {}) align them",
            rank, p.name, p.shape, n, w.shape, from, at, B, B, B * config.tp, config.tp);
      }
    }
  }
  return std::nullopt;
}

std::optional<std::string> slice_refusal(const OptimConfig& optim, const ModelConfig& config);

}  // namespace

std::optional<std::string> sliced_optimizer_refusal(const OptimConfig& optim,
                                                    const ModelConfig& config) {
  // A search checks every candidate of a layout with the same model and optimizer: the last
  // few answers kept (the block-wise check walks every run of every rank's slices).
  struct Answer {
    std::string optim;
    ModelConfig config;
    std::optional<std::string> refusal;
  };
  static std::mutex mutex;
  static std::deque<Answer> kept;
  {
    const std::lock_guard lock(mutex);
    for (const Answer& a : kept)
      if (a.optim == optim.name && a.config == config) return a.refusal;
  }
  std::optional<std::string> refusal = slice_refusal(optim, config);
  const std::lock_guard lock(mutex);
  if (kept.size() == 4) kept.pop_front();
  kept.push_back({optim.name, config, refusal});
  return refusal;
}

namespace {

std::optional<std::string> slice_refusal(const OptimConfig& optim, const ModelConfig& config) {
  const std::string& o = optim.name;
  // Element-wise: each element's update reads that element's weight, gradient and state alone
  // (AdamW's bf16 moments rounded to nearest even per element too).
  if (o == "adamw" || o == "sgd" || o == "lion") return std::nullopt;
  if (o == "adamw8bit" || o == "lion8bit") return blockwise_refusal(config, QuantFormat{});
  // 4-bit AdamW: the rank-1 scales of a matrix's second moment are taken over the tensor group
  // in the update (AdamW4bit::set_tensor_split); its first moment (and a 1-D tensor's second)
  // is block-wise, 128 values a block, as 8-bit state is at 256.
  if (o == "adamw4bit") return blockwise_refusal(config, AdamW4bit::first_moment_format());
  // Adam-mini: the row-parallel projections' rows take their sums of squares over the tensor
  // group in the update (AdamMini::set_tensor_split); every other block (a head of q or k, a
  // column-parallel row, a token's row, a replicated tensor) is whole on the rank.
  if (o == "adam-mini") return std::nullopt;
  if (is_apollo(o))
    return std::string(
        "its random projection is of a whole matrix: a rank's slice projected alone gets the "
        "slice's own channel scales, not the whole matrix's, so each rank would step another "
        "algorithm than one process");
  if (is_galore(o))
    return std::string(
        "the SVD of a rank's slice spans another subspace than the whole matrix's, so each "
        "rank would step another algorithm than one process");
  return fmt::format("--optim {} is not known to step tensor slices", o);
}

}  // namespace

}  // namespace memfit
