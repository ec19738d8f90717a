// The planner's model of a training step's time on this CPU: the step's GEMM FLOPs at the GEMM
// rates calibration measured (plan/calibration.h), plus its element-wise traffic at the measured
// rate of memfit's element-wise kernels, plus the optimizer's traffic at the streaming rate.
// What it counts and how well it predicts: docs/notes/planner.md, Note [Step-time model], and
// bench/e2e/plan_time_accuracy.py.
#pragma once

#include "memfit/dist/comm_volume.h"
#include "memfit/model/activation_plan.h"
#include "memfit/model/model_config.h"
#include "memfit/model/step_plan.h"
#include "memfit/plan/calibration.h"
#include "memfit/plan/link_model.h"
#include "memfit/plan/tensor_comm.h"

namespace memfit {

// Per optimizer step (grad_accum micro-batches, each run backward_passes times, and one
// update), in seconds by part. A pipeline stage's (ModelConfig::stage): its blocks, the
// embeddings on the first stage, the final norm and LM head on the last, and on every stage but
// the last the forward run again from the kept input before each backward (Note [Pipeline
// parallel]); how the stages make a step is plan/pipeline_time.h.
struct StepTime {
  double block_gemm = 0;   // the blocks' matmuls, recomputation included
  double attention = 0;    // attention (scores and mixing), recomputation included
  double head_gemm = 0;    // the LM head's matmuls
  double elementwise = 0;  // LayerNorm, residual, GELU, bias sums, conversions, softmax
  double compression = 0;  // --act-compress: quantising saved activations, restoring them
  double optimizer = 0;    // the update, zeroing and clipping the gradients
  // Offload: the update's disk time beyond its compute (the reads and writes run while pieces
  // are updated, so only the excess adds to the step; with --update-in-backward as well, the
  // backward waiting for each unit's update), and the forward's and the backward's disk time
  // (--offload-params' block reads, --offload-grads' gradient I/O) beyond each phase's compute.
  double offload_io = 0;
  // Several ranks: the data group's collectives, the bytes each rank sends on the link the
  // group spans (plan/link_model.h; on this host the memory-copy rate, each byte copied in and
  // out) with a latency a message, and the sums of the reduced ones at the streaming rate;
  // counted whole, as if nothing overlapped (a first-order estimate: Note [Fit a budget]).
  double comm = 0;
  // --tp: the tensor group's collectives (plan/tensor_comm.h: tensor_comm_seconds), priced one
  // all-reduce at a time by its bytes on the tensor group's link; counted whole, nothing
  // overlapped, but with --tp-overlap less `tensor_comm_hidden`: each column-parallel d(input)
  // sum runs while its layer's weight-gradient GEMM computes, so the pair costs the longer of
  // the two, and the shorter is taken off (min(sum, GEMM) per qkv and fc of every block
  // backward; nothing with LoRA, whose frozen base has no weight gradient to hide behind).
  double tensor_comm = 0;
  double tensor_comm_hidden = 0;  // not in total(): already taken off tensor_comm
  double total() const {
    return block_gemm + attention + head_gemm + elementwise + compression + optimizer +
           offload_io + comm + tensor_comm;
  }
  // What runs once per micro-batch pass (the compute and the tensor group's collectives, which
  // sit inside the layers): a pipeline stage's work in its slots. The rest (the update, the
  // data group's collectives, offload I/O) runs once a step.
  double micro_batches() const {
    return block_gemm + attention + head_gemm + elementwise + compression + tensor_comm;
  }
  // Term by term: a rank's time over the parts it runs (an interleaved rank's chunks).
  StepTime& operator+=(const StepTime& o) {
    block_gemm += o.block_gemm;
    attention += o.attention;
    head_gemm += o.head_gemm;
    elementwise += o.elementwise;
    compression += o.compression;
    optimizer += o.optimizer;
    offload_io += o.offload_io;
    comm += o.comm;
    tensor_comm += o.tensor_comm;
    tensor_comm_hidden += o.tensor_comm_hidden;
    return *this;
  }
};

// --precision fp8's casts (Note [FP8]) in the element-wise term, in 4-byte elements: per token
// of one block's forward (and recomputation) and of its backward, and per block pass for its
// weights.
struct Fp8CastTraffic {
  double forward = 0, backward = 0, weight = 0;
};
Fp8CastTraffic fp8_cast_traffic(const ModelConfig& model);

struct StepTimeInputs {
  // Finalized; under --tp one rank's (model.tp): every term reads the rank's widths (its heads,
  // MLP width and vocabulary rows), the norms and residual stream whole.
  ModelConfig model;
  int B = 0, T = 0, grad_accum = 1;
  // Forward+backward passes of each micro-batch (RunSpec::backward_passes): 2 where
  // --update-in-backward clips on the global norm (a measuring pass, then the stepping pass);
  // the micro-batch's compute counts that often, the update once.
  int backward_passes = 1;
  // --update-in-backward (RunSpec::update_in_backward): no slab for zero_grad, but each pass
  // zeroes the unit buffers as it opens them (the edges as the micro-batch starts, the block
  // slot as each block's backward starts: optim/backward_update.cpp, dist/zero/unit_grads.cpp),
  // about 4 bytes a parameter a pass, so the zeroing counts backward_passes times, not once.
  bool update_in_backward = false;
  // precision, attention, checkpoint policy, and the LM head's chunk as the step plan took it
  // (StepPlan::options; the widened route widens the head's weight once a chunk each way)
  ActivationOptions options;
  size_t param_count = 0;        // the parameter slab's elements
  size_t optimizer_bytes = 0;    // the optimizer's state (this rank's shard's from ZeRO stage 1)
  // The update's matrix products (APOLLO's projections: Optimizer::update_flops), at the f32
  // GEMM rate; 0 for the element-wise optimizers.
  double optimizer_flops = 0;
  // ZeRO: the elements this rank's update steps (its shard from stage 1 on) and whose squares
  // the gradient norm sums (its shard at stage 2, where only the owner holds the sums); 0: all
  // param_count. zero_grad clears the whole slab at every stage.
  size_t update_params = 0, norm_params = 0;
  // Several ranks: the bytes the step's collectives copy on this rank (what it sends and what
  // it receives, each copied once, through shared memory: dist::CommVolume::copied_bytes) and the
  // bytes the sums of the reduced ones read and write (CommVolume::summed_bytes).
  double comm_copied_bytes = 0, comm_summed_bytes = 0;
  // The messages those collectives send one after another (ring_messages), each paying the
  // link's latency; and the link the data group spans (default: this host's, no latency).
  double comm_messages = 0;
  Link data_link;
  // --tp: the tensor group's collectives of one step (tensor_comm_per_step), over model.tp ranks,
  // on the link the tensor group spans.
  TensorCommVolume tensor_comm;
  Link tensor_link;
  bool tp_overlap = false;  // --tp-overlap on (StepTime::tensor_comm_hidden)
  bool master_weights = false;   // bf16/fp16 with an FP32 master copy
  // --act-compress: the bytes a micro-batch's (de)quantisation passes move
  // (compression_traffic_bytes of its step plan).
  double compression_bytes = 0;
  // --offload-optimizer nvme: seconds the update's reads and writes take at the disk's measured
  // rates (offload/disk_rate.h); 0 without offload.
  double offload_io_seconds = 0;
  // --offload-params nvme: seconds the micro-batches' block reads take at the disk's read rate,
  // half for the forward and half for the backward; they run while the blocks before compute,
  // so only what exceeds each phase's compute lengthens the step (the update's write-back is in
  // offload_io_seconds).
  double param_read_seconds = 0;
  // --offload-grads nvme: seconds the backward's gradient writes and reads back take (the
  // update's reads of them are in offload_io_seconds).
  double offload_backward_io_seconds = 0;
};

// The bytes the (de)quantisation passes of --act-compress move in one micro-batch, read from
// the step plan (Note [Activation compression]): every compressed buffer ("<tag>.codes" with
// its "<tag>.scales") is quantised once, reading its exact values (in the type of their
// "ws.act.<name>" scratch) and writing codes and scales, and restored once, the reverse. 0
// without compression.
double compression_traffic_bytes(const StepPlan& plan);

StepTime estimate_step_time(const StepTimeInputs& in, const Calibration& rates);

// The messages a rank of `world` sends one after another for the collectives of `v`, as rings
// in buckets of `bucket_bytes` (0: one bucket): 2 (world - 1) per all-reduce bucket, world - 1
// per reduce-scatter or all-gather bucket. What the step-time model charges the link's latency
// for; 0 for one rank.
double ring_messages(const dist::CommVolume& v, int world, size_t bucket_bytes);

}  // namespace memfit
