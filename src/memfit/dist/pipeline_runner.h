// One training step's micro-batches through a pipeline stage (Note [Pipeline parallel]): the
// schedule's forwards and backwards in order (model/pipeline_schedule.h), each forward's input
// received from the previous stage and its output sent to the next, each backward's output
// gradient received from the next stage and its input gradient sent back, over the pipeline
// group's point to point (Communicator::send_async / recv_async). The stage's own computation
// is the caller's (two callbacks), so this file moves bytes and keeps the order only.
//
// The stage keeps each micro-batch's input from its forward to its backward (the boundary
// activation, GPipe's re-materialisation: the backward recomputes the stage's forward from it),
// so a stage holds pipe_in_flight(ops) of them at once: 1F1B's stage s min(P - s, m), GPipe's m.
// Sends are posted and finished later, so compute overlaps them; a forward's send buffer is
// reused only once the micro-batch it held has had its backward here (then the next stage has
// received it), which is why the ring of send buffers is as long as the inputs kept.
//
// Interleaved (`virtual_stages` V > 1; model/pipeline_interleaved.h): the rank holds V chunks,
// chunk c being virtual stage c x P + rank; a forward receives from the previous virtual
// stage (rank r - 1, or rank P - 1's chunk c - 1 on rank 0) and sends to the next, a backward
// the reverse, each message tagged by the chunk that receives it (kind + 4 x chunk: chunk 0's
// tags are 1F1B's, 0 and 1, and 2 stays the tied gradient's). Kept inputs and forward sends take
// the lowest free slot at a forward and give it back at its backward, so a rank holds exactly
// chunk_in_flight of each (over the chunks that have a previous, or a next, virtual stage).
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "memfit/memory/pool.h"
#include "memfit/model/activation_plan.h"
#include "memfit/model/model_config.h"
#include "memfit/model/pipeline_interleaved.h"
#include "memfit/model/pipeline_schedule.h"
#include "memfit/dist/communicator.h"

namespace memfit::dist {

// What a stage allocates from the pool for a step, by category: the planner's count
// (pipeline_buffers) and the runner's allocations are the same numbers.
struct PipelineBuffers {
  int64_t activations = 0;  // "pp.inputs": the kept stage inputs (stages after the first)
  int64_t comm = 0;         // "pp.send", "pp.grad.recv", "pp.grad.send": transfer buffers
};
// Stage `stage` of `stages`, `micro_batches` micro-batches of `boundary_bytes` between stages;
// `virtual_stages` V > 1: the interleaved schedule's rank `stage`, V chunks (`schedule`
// ignored).
PipelineBuffers pipeline_buffers(PipeSchedule schedule, int stage, int stages,
                                 int micro_batches, int64_t boundary_bytes,
                                 int virtual_stages = 1);

// The f32 elements a stage sends the next per micro-batch (and receives back as their
// gradient): the residual stream of B x T tokens, d_model each; under --tp every tensor rank
// sends its own copy to the rank of the same tensor index on the next stage, and with --sp its
// rows alone, B x T / tp (Note [Pipeline parallel], "Stages of tensor groups"). The runner and
// the planner both size the transfers by it.
int64_t pipeline_boundary_floats(const ModelConfig& config, const ActivationOptions& options,
                                 int B, int T);

struct PipelineStageFns {
  // Micro-batch m's forward: `in` (the previous stage's output; empty on the first stage) into
  // `out` (sent to the next stage; empty on the last). `in` stays as given until m's backward.
  std::function<void(int m, std::span<const float> in, std::span<float> out)> forward;
  // Micro-batch m's backward: `in` (the same as its forward's), `dout` (the next stage's
  // gradient of `out`; empty on the last stage) into `din` (empty on the first stage).
  std::function<void(int m, std::span<const float> in, std::span<const float> dout,
                     std::span<float> din)>
      backward;
};

// The same over a rank's V chunks (interleaved): `chunk` is the rank's chunk, 0 .. V - 1 (virtual
// stage chunk x P + rank); `in` is empty on virtual stage 0, `out` and `dout` on the last,
// `din` on virtual stage 0.
struct PipelineChunkFns {
  std::function<void(int chunk, int m, std::span<const float> in, std::span<float> out)>
      forward;
  std::function<void(int chunk, int m, std::span<const float> in, std::span<const float> dout,
                     std::span<float> din)>
      backward;
};

class PipelineRunner {
 public:
  // `pipe`: the pipeline group (rank = stage); `boundary_floats`: the f32 elements a stage
  // sends to the next per micro-batch (pipeline_boundary_floats). Allocates pipeline_buffers
  // from `pool`. `virtual_stages` V > 1: the interleaved schedule over V chunks a rank
  // (check_interleaved's refusals; `schedule` ignored).
  PipelineRunner(Communicator& pipe, PipeSchedule schedule, int micro_batches,
                 int64_t boundary_floats, MemoryPool& pool, int virtual_stages = 1);
  // One step: every micro-batch through this stage, in the schedule's order. Returns when its
  // last send has completed. One chunk a rank (V = 1) only.
  void run(const PipelineStageFns& fns);
  // The same over the rank's chunks, any V.
  void run_chunks(const PipelineChunkFns& fns);
  // Forwards alone (an evaluation): micro-batches 0 .. n - 1 in order, each input received, run
  // and its output sent on, through the first slots of the step's buffers (nothing more is
  // allocated); each send is finished before the next forward. `forward` as PipelineStageFns's.
  // One chunk a rank (V = 1) only.
  void run_forwards(
      int n, const std::function<void(int m, std::span<const float> in, std::span<float> out)>&
                 forward);
  // The same over the rank's chunks (any V): micro-batch i through the virtual stages in order,
  // chunk 0 first, each chunk's input received from the previous virtual stage and its output
  // sent to the next (finished before the next forward), through the first slots.
  void run_chunk_forwards(
      int n, const std::function<void(int chunk, int m, std::span<const float> in,
                                      std::span<float> out)>& forward);
  int stage() const { return stage_; }
  int stages() const { return stages_; }
  int virtual_stages() const { return virtual_; }
  const std::vector<ChunkOp>& ops() const { return ops_; }

 private:
  std::span<float> slot(Allocation& a, int i) const;
  bool has_previous(int chunk) const { return chunk * stages_ + stage_ > 0; }
  bool has_next(int chunk) const { return chunk * stages_ + stage_ + 1 < stages_ * virtual_; }

  Communicator& pipe_;
  const int stage_, stages_, virtual_, micro_batches_;
  const int64_t n_;
  std::vector<ChunkOp> ops_;
  // Slots of kept inputs (chunks with a previous virtual stage) and of forward sends (chunks
  // with a next one): the most micro-batches in flight at once over those chunks.
  int kept_inputs_ = 0, kept_sends_ = 0;
  Allocation inputs_, sends_, grad_recv_, grad_send_;
};

}  // namespace memfit::dist
