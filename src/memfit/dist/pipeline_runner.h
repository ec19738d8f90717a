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
#pragma once

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "memfit/memory/pool.h"
#include "memfit/model/activation_plan.h"
#include "memfit/model/model_config.h"
#include "memfit/model/pipeline_schedule.h"
#include "memfit/dist/communicator.h"

namespace memfit::dist {

// What a stage allocates from the pool for a step, by category: the planner's count
// (pipeline_buffers) and the runner's allocations are the same numbers.
struct PipelineBuffers {
  int64_t activations = 0;  // "pp.inputs": the kept stage inputs (stages after the first)
  int64_t comm = 0;         // "pp.send", "pp.grad.recv", "pp.grad.send": transfer buffers
};
// Stage `stage` of `stages`, `micro_batches` micro-batches of `boundary_bytes` between stages.
PipelineBuffers pipeline_buffers(PipeSchedule schedule, int stage, int stages,
                                 int micro_batches, int64_t boundary_bytes);

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

class PipelineRunner {
 public:
  // `pipe`: the pipeline group (rank = stage); `boundary_floats`: the f32 elements a stage
  // sends to the next per micro-batch (pipeline_boundary_floats). Allocates pipeline_buffers
  // from `pool`.
  PipelineRunner(Communicator& pipe, PipeSchedule schedule, int micro_batches,
                 int64_t boundary_floats, MemoryPool& pool);
  // One step: every micro-batch through this stage, in the schedule's order. Returns when its
  // last send has completed.
  void run(const PipelineStageFns& fns);
  // Forwards alone (an evaluation): micro-batches 0 .. n - 1 in order, each input received, run
  // and its output sent on, through the first slots of the step's buffers (nothing more is
  // allocated); each send is finished before the next forward. `forward` as PipelineStageFns's.
  void run_forwards(
      int n, const std::function<void(int m, std::span<const float> in, std::span<float> out)>&
                 forward);
  int stage() const { return stage_; }
  int stages() const { return stages_; }
  const std::vector<PipeOp>& ops() const { return ops_; }

 private:
  std::span<float> slot(Allocation& a, int i) const;

  Communicator& pipe_;
  const int stage_, stages_;
  const int64_t n_;
  std::vector<PipeOp> ops_;
  int kept_ = 0;  // micro-batches in flight: slots of inputs and of forward sends
  Allocation inputs_, sends_, grad_recv_, grad_send_;
};

}  // namespace memfit::dist
