// Megatron-LM's interleaved 1F1B (`--pp-schedule interleaved --pp-virtual V`; Narayanan et al.
// 2021, "Efficient Large-Scale Language Model Training on GPU Clusters", section 2.2; Note
// [Pipeline parallel], "Interleaved"): the blocks cut into P x V contiguous chunks (virtual
// stages), rank r of the P holding chunks r, r + P, ..., r + (V - 1) P, so a micro-batch
// visits every rank V times. Each rank's list of chunk forwards and backwards is Megatron's
// (megatron/core/pipeline_parallel/schedules.py, forward_backward_pipelining_with_interleaving):
// micro-batches in groups of P, each group through chunk 0, then chunk 1, ...; the backwards the
// same groups through the chunks in reverse; a warm-up of (P - r - 1) x 2 + (V - 1) x P
// forwards (every forward first when m == P), then one forward and one backward, then the
// drain. The bubble is (P - 1)/(V m) of the ideal step, against 1F1B's (P - 1)/m.
//
// Every chunk runs its backwards in micro-batch order 0, 1, ..., m - 1 (a group's P
// micro-batches in order, the groups in order), so each parameter, which belongs to one chunk,
// sums its micro-batches' gradients in one process's order: bit-identical to one process, as
// GPipe and 1F1B are.
//
// Kept apart from pipeline_schedule.h (which run_spec.h includes everywhere): the runner
// (dist/pipeline_runner.h), the run's checks (plan/run_spec.cpp), the planner's time
// (plan/pipeline_time.h) and the trainer over a rank's chunks (train/train_run_chunks.cpp) read it.
#pragma once

#include <vector>

#include "memfit/model/pipeline_schedule.h"

namespace memfit {

// One operation of a rank: micro-batch `micro`'s forward or backward through the rank's chunk
// `chunk` (0 .. V - 1: the rank's chunk c is virtual stage c x P + rank).
struct ChunkOp {
  PipeOp::Kind kind = PipeOp::Kind::forward;
  int chunk = 0;
  int micro = 0;
  bool operator==(const ChunkOp&) const = default;
};

// The virtual stage of rank `rank`'s chunk `chunk` among P ranks: chunk x P + rank.
inline int virtual_stage(int rank, int chunk, int P) { return chunk * P + rank; }

// ConfigError naming the values unless V >= 2, P >= 2 and m a multiple of P (Megatron's
// condition: the micro-batches go through the chunks in groups of P), with the option names.
void check_interleaved(int stages, int virtual_stages, int micro_batches);

// Rank `rank` of P's operations for m micro-batches over V chunks, in order (check_interleaved
// first). With V = 1 it is 1F1B's list (pipe_stage_ops), chunk 0 throughout.
std::vector<ChunkOp> interleaved_stage_ops(int rank, int stages, int virtual_stages,
                                           int micro_batches);

// Any schedule as chunk operations: GPipe and 1F1B (V = 1, chunk 0), or the interleaved list.
std::vector<ChunkOp> chunk_stage_ops(PipeSchedule schedule, int virtual_stages, int rank,
                                     int stages, int micro_batches);

// The most micro-batches in flight at once (forward run, backward not yet) over the chunks
// `counted(chunk)` selects: how many stage inputs (chunks after virtual stage 0) or forward
// sends (chunks before the last virtual stage) a rank keeps at once. The runner hands out
// slots from a free list (the lowest free one at a forward, back at its backward), so it
// allocates exactly this many.
template <typename Counted>
int chunk_in_flight(const std::vector<ChunkOp>& ops, Counted counted) {
  int now = 0, most = 0;
  for (const ChunkOp& op : ops) {
    if (!counted(op.chunk)) continue;
    now += op.kind == PipeOp::Kind::forward ? 1 : -1;
    most = now > most ? now : most;
  }
  return most;
}

// Whether the ranks' lists (`rank_ops[r]`, V chunks each) run to the end under the runner's
// waits: a forward waits for the previous virtual stage's forward of its micro-batch (a
// blocking receive); a backward waits for the next virtual stage's backward of its micro-batch
// and, as the runner sends every gradient from one buffer, for the previous gradient this rank
// sent to have been received (the rank it went to has reached the backward that receives it:
// a backward's first act is that receive). Sends of forwards never wait: a slot is reused
// only after its micro-batch's backward here, by when the next virtual stage has received it.
bool chunk_runs_to_completion(const std::vector<std::vector<ChunkOp>>& rank_ops,
                              int virtual_stages);

}  // namespace memfit
