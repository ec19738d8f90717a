// Megatron-LM's interleaved 1F1B; see pipeline_interleaved.h and Note [Pipeline parallel],
// "Interleaved".
#include "memfit/model/pipeline_interleaved.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "memfit/core/error.h"

namespace memfit {

void check_interleaved(int stages, int virtual_stages, int micro_batches) {
  if (virtual_stages < 2)
    MEMFIT_THROW(ConfigError, "pp-virtual",
                 "--pp-schedule interleaved needs --pp-virtual 2 or more (chunks a rank "
                 "holds), got {}",
                 virtual_stages);
  if (stages < 2)
    MEMFIT_THROW(ConfigError, "pp-virtual",
                 "--pp-schedule interleaved needs --pp 2 or more, got {}", stages);
  if (micro_batches < 1 || micro_batches % stages != 0)
    MEMFIT_THROW(ConfigError, "pp-virtual",
                 "--pp-schedule interleaved: --grad-accum {} is not a multiple of --pp {} (the "
                 "micro-batches go through the chunks in groups of P)",
                 micro_batches, stages);
}

std::vector<ChunkOp> interleaved_stage_ops(int rank, int stages, int virtual_stages,
                                           int micro_batches) {
  const int P = stages, V = virtual_stages, m = micro_batches;
  using K = PipeOp::Kind;
  if (V == 1) {
    std::vector<ChunkOp> ops;
    for (const PipeOp& op : pipe_stage_ops(PipeSchedule::one_f_one_b, rank, P, m))
      ops.push_back({op.kind, 0, op.micro});
    return ops;
  }
  check_interleaved(P, V, m);
  if (rank < 0 || rank >= P)
    MEMFIT_THROW(ConfigError, "pp-virtual", "rank {} of --pp {}", rank, P);
  // Megatron's numbering: the k-th forward (backward) of a rank is chunk (k mod PV) / P
  // (reversed for backwards) and micro-batch (k / PV) x P + k mod P.
  const int total = m * V;
  auto op = [&](int k, K kind) {
    int chunk = (k % (P * V)) / P;
    if (kind == K::backward) chunk = V - 1 - chunk;
    return ChunkOp{kind, chunk, (k / (P * V)) * P + k % P};
  };
  const int warmup =
      m == P ? total : std::min((P - rank - 1) * 2 + (V - 1) * P, total);
  std::vector<ChunkOp> ops;
  for (int k = 0; k < warmup; ++k) ops.push_back(op(k, K::forward));
  for (int k = 0; k < total - warmup; ++k) {
    ops.push_back(op(warmup + k, K::forward));
    ops.push_back(op(k, K::backward));
  }
  for (int k = total - warmup; k < total; ++k) ops.push_back(op(k, K::backward));
  return ops;
}

std::vector<ChunkOp> chunk_stage_ops(PipeSchedule schedule, int virtual_stages, int rank,
                                     int stages, int micro_batches) {
  if (virtual_stages > 1)
    return interleaved_stage_ops(rank, stages, virtual_stages, micro_batches);
  std::vector<ChunkOp> ops;
  for (const PipeOp& op : pipe_stage_ops(schedule, rank, stages, micro_batches))
    ops.push_back({op.kind, 0, op.micro});
  return ops;
}

bool chunk_runs_to_completion(const std::vector<std::vector<ChunkOp>>& rank_ops,
                              int virtual_stages) {
  const int P = static_cast<int>(rank_ops.size()), V = virtual_stages, S = P * V;
  int m = 0;
  for (const auto& ops : rank_ops)
    for (const ChunkOp& op : ops) m = std::max(m, op.micro + 1);
  // Per (kind, virtual stage, micro-batch): where the operation sits in its rank's list.
  auto key = [&](PipeOp::Kind kind, int vs, int micro) {
    return (static_cast<size_t>(kind == PipeOp::Kind::forward ? 0 : 1) * static_cast<size_t>(S) +
            static_cast<size_t>(vs)) * static_cast<size_t>(m) + static_cast<size_t>(micro);
  };
  std::vector<size_t> at(2 * static_cast<size_t>(S) * static_cast<size_t>(m), SIZE_MAX);
  for (int r = 0; r < P; ++r)
    for (size_t i = 0; i < rank_ops[static_cast<size_t>(r)].size(); ++i) {
      const ChunkOp& op = rank_ops[static_cast<size_t>(r)][i];
      at[key(op.kind, virtual_stage(r, op.chunk, P), op.micro)] = i;
    }
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  // Operation (kind, vs, micro) has run (its rank is past it).
  auto done = [&](PipeOp::Kind kind, int vs, int micro) {
    const size_t i = at[key(kind, vs, micro)];
    return i != SIZE_MAX && next[static_cast<size_t>(vs % P)] > i;
  };
  // Per rank, the last gradient it sent: (virtual stage it went to, micro-batch), or none. A
  // send is received once its rank has reached the backward that receives it (the receive is
  // that backward's first act).
  std::vector<std::pair<int, int>> sent(static_cast<size_t>(P), {-1, -1});
  auto received = [&](std::pair<int, int> s) {
    if (s.first < 0) return true;
    const size_t i = at[key(PipeOp::Kind::backward, s.first, s.second)];
    return i != SIZE_MAX && next[static_cast<size_t>(s.first % P)] >= i;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      const auto& ops = rank_ops[static_cast<size_t>(r)];
      size_t& i = next[static_cast<size_t>(r)];
      while (i < ops.size()) {
        const ChunkOp op = ops[i];
        const int vs = virtual_stage(r, op.chunk, P);
        const bool ready =
            op.kind == PipeOp::Kind::forward
                ? (vs == 0 || done(PipeOp::Kind::forward, vs - 1, op.micro))
                : (done(PipeOp::Kind::forward, vs, op.micro) &&
                   (vs + 1 == S || done(PipeOp::Kind::backward, vs + 1, op.micro)) &&
                   received(sent[static_cast<size_t>(r)]));
        if (!ready) break;
        if (op.kind == PipeOp::Kind::backward && vs > 0)
          sent[static_cast<size_t>(r)] = {vs - 1, op.micro};
        ++i;
        progress = true;
      }
    }
  }
  for (int r = 0; r < P; ++r)
    if (next[static_cast<size_t>(r)] < rank_ops[static_cast<size_t>(r)].size()) return false;
  return true;
}

}  // namespace memfit
