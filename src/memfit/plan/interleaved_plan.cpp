#include "memfit/plan/interleaved_plan.h"

#include "memfit/core/error.h"
#include "memfit/dist/communicator_tensor_group.h"
#include "memfit/dist/pipeline_runner.h"
#include "memfit/model/param_layout.h"
#include "memfit/optim/optimizer.h"

namespace memfit {

PlanReport plan_interleaved_rank(const RunSpec& spec, int stage, int data, bool timed) {
  MEMFIT_CHECK(spec.interleaved() && stage >= 0 && stage < spec.pp(), "plan",
               "rank {} of an interleaved run of --pp {} --pp-virtual {}", stage, spec.pp(),
               spec.pipe_virtual);
  const int P = spec.pp(), V = spec.pipe_virtual;
  auto at = [](PlanReport& r, Category c) -> size_t& {
    return r.by_category[static_cast<size_t>(c)];
  };
  PlanReport rank;
  for (int c = 0; c < V; ++c) {
    const RunSpec run = spec.stage(c * P + stage);
    const PlanReport chunk = timed ? plan_training(run, data) : plan_memory(run, data);
    if (c == 0) {
      rank = chunk;
      continue;
    }
    // One loader a rank: its staging once.
    for (Category k : kAllCategories)
      if (k != Category::staging)
        at(rank, k) += chunk.by_category[static_cast<size_t>(k)];
    rank.flops += chunk.flops;
    rank.recompute_flops += chunk.recompute_flops;
    rank.step_time += chunk.step_time;
    rank.est_step_seconds += chunk.est_step_seconds;
    rank.comm_per_step += chunk.comm_per_step;
    // Offload (Note [NVMe offload], "Under --pp"): each chunk's own files, I/O and rings (its
    // optimizer's staging ring, its model's ring of block slots) beside the others'.
    for (Category k : kAllCategories)
      rank.disk_by_category[static_cast<size_t>(k)] +=
          chunk.disk_by_category[static_cast<size_t>(k)];
    rank.disk_bytes += chunk.disk_bytes;
    rank.io_bytes_per_step += chunk.io_bytes_per_step;
    rank.param_read_bytes += chunk.param_read_bytes;
    rank.param_written_bytes += chunk.param_written_bytes;
    rank.offload_staging_bytes += chunk.offload_staging_bytes;
    rank.param_ring_bytes += chunk.param_ring_bytes;
    at(rank, Category::staging) += chunk.offload_staging_bytes + chunk.param_ring_bytes;
  }
  // The runner's kept inputs (activations) and transfer buffers (comm) over the chunks.
  const RunSpec first = spec.stage(stage);
  const dist::PipelineBuffers pb = dist::pipeline_buffers(
      spec.pipe_schedule, stage, P, spec.grad_accum,
      dist::pipeline_boundary_floats(first.model, spec.activation_options(), spec.batch,
                                     spec.T) *
          int64_t{sizeof(float)},
      V);
  at(rank, Category::activations) += static_cast<size_t>(pb.activations);
  at(rank, Category::comm) += static_cast<size_t>(pb.comm);
  // --tp: the tensor group's buffers are lent once a rank, not once a chunk.
  at(rank, Category::comm) -= static_cast<size_t>(
      (V - 1) * dist::tensor_group_buffer_bytes(first.model.tp, spec.sp,
                                                int64_t{spec.batch} * spec.T * first.model.d_model));
  // bf16 gradients: one widening buffer a rank, the largest chunk's (TrainRun::make_grad_widen).
  if (spec.grad_dtype == DType::bf16) {
    auto widen = [&](const RunSpec& run) {
      return MemoryPool::round_up(
          static_cast<size_t>(std::max<int64_t>(
              1, grad_widen_elements(run.optim, ParamLayout(run.model)))) *
          sizeof(float));
    };
    size_t most = 0;
    for (int c = 0; c < V; ++c) most = std::max(most, widen(spec.stage(c * P + stage)));
    at(rank, Category::staging) += most - widen(first);
  }
  rank.peak_bytes = 0;
  for (size_t b : rank.by_category) rank.peak_bytes += b;
  rank.peak_live_bytes = rank.peak_bytes;  // every chunk's arena is held the whole run
  return rank;
}

int64_t interleaved_rank_params(const RunSpec& spec, int stage) {
  int64_t n = 0;
  for (int c = 0; c < spec.pipe_virtual; ++c)
    n += spec.stage(c * spec.pp() + stage).model.num_params();
  return n;
}

}  // namespace memfit
