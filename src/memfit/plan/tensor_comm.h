// The tensor group's collectives of one training step under --tp (Note [Tensor parallel] in
// docs/notes/tensor-parallel.md, "Collectives in BlockStep"), counted from the step plan: per
// micro-batch the two row-parallel all-reduces of every block's forward (again in every
// recomputed one), the two column-parallel ones of every backward, the embedding's and the LM
// head's d(norm), each B x T x C f32; the loss's statistics per chunk of rows (the row max, R
// floats, and the sums, 2R doubles, exchanged as gathers); and the update's gradient check (2
// doubles), and with key/value heads replicated (tp above n_kv_head) their weights' gradients
// gathered once (a ZeRO 2-3 rank: its shard's part); Adam-mini's and 4-bit AdamW's update
// (optim/tensor_split.h: a double a row-parallel row, a float a maximum of a split dimension,
// over the rank's optimizer range) gathered too. The run logs what its tensor group covered
// each step (tensor_comm_bytes), which the tests compare with this; the step-time estimate
// prices them with tensor_comm_seconds.
//
// Under --sp (Note [Sequence parallel]) the B x T x C all-reduces become reduce-scatters (the
// same count, their input bytes) and the sequence's gathers add to `gathered` (a rank's rows,
// B x T / tp x C each, in the matmuls' operand dtype: f32, or bf16 in bf16): two in every
// forward and recomputed block (the norms' outputs), four in every backward (d(output) twice,
// the recomputed norms' outputs twice), the final norm's output once; the embedding's d(output)
// (f32) once; and once a step one all-reduce of each norm parameter's gradient
// (sequence_partial).
//
// A pipeline stage (--pp with --tp; spec.model.stage) counts its own: the embedding's on the
// first stage, the LM head's and the loss's statistics on the last, and a stage before the last
// its forward's twice (it reruns each forward from the kept input before the backward).
#pragma once

#include <cstdint>

#include "memfit/model/step_plan.h"
#include "memfit/plan/calibration.h"
#include "memfit/plan/link_model.h"
#include "memfit/plan/run_spec.h"

namespace memfit {

struct TensorCommVolume {
  int64_t all_reduce_bytes = 0, all_reduce_count = 0, gathered_bytes = 0;
  int64_t reduce_scatter_bytes = 0, reduce_scatter_count = 0;  // --sp
  // The bytes of one all-reduce (B x T x C f32 each without --sp); 0 without any.
  int64_t all_reduce_each() const {
    return all_reduce_count ? all_reduce_bytes / all_reduce_count : 0;
  }
};

// Zero without --tp (spec.model.tp 1). `step`: plan_step's for the spec's model and options.
// `data_rank`: the rank in the data group, whose ZeRO shard (stages 2-3) bounds the replicated
// key/value gradients it gathers; every other figure is the same on every rank.
TensorCommVolume tensor_comm_per_step(const RunSpec& spec, const StepPlan& step,
                                      int data_rank = 0);

// Seconds the collectives of `v` take over `tp` ranks on `link`, nothing overlapped: each
// all-reduce as the communicator runs it (a reduce-scatter of rank-ordered sums, then an
// all-gather: Note [Deterministic reduction]), the bytes a rank sends at the link's rate
// (this host's, Link{}: every byte sent and received copied once at rates.copy_bytes_per_s) with
// its latency for each of the ring's 2 (tp - 1) messages, and its sums read and written at
// rates.stream_bytes_per_s; times the count. The gathers likewise, (tp - 1) parts of each
// rank's sent (their latency not counted: they are a few a micro-batch beside the all-reduces);
// --sp's reduce-scatters (tp - 1) messages each. 0 at tp 1.
double tensor_comm_seconds(const TensorCommVolume& v, int tp, const Calibration& rates,
                           const Link& link = {});

}  // namespace memfit
