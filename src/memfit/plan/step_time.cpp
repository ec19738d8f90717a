// The step-time model; see step_time.h and Note [Step-time model] in docs/notes/planner.md.
#include "memfit/plan/step_time.h"

#include <algorithm>
#include <cmath>

#include <map>
#include <string>
#include <string_view>

#include "memfit/core/error.h"

#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/plan/memory_plan.h"

namespace memfit {

namespace {

// Element-wise traffic in f32-sized elements (4 bytes) per token, outside the GEMMs, counted
// from what the GPT-2 block (model/gpt2/gpt2_block.cpp) runs, in one rank's widths (Note [Tensor
// parallel]): C the residual stream's width (whole on every rank), Q the rank's q|k|v width, A
// its attention output's, F its MLP's, V its vocabulary rows; at tp 1 Q = 3C, A = C, F = 4C:
// - a block's forward: LayerNorm 2C twice, residual add 3C twice, GELU 2F: 10C + 2F (18C);
// - its backward: LayerNorm 4C twice, its output recomputed 2C twice (Note [Recomputed
//   norms]), GELU recomputed and differentiated in one pass 4F, the two residual gradients 2C
//   each, the bias sums over the four matmuls' output gradients Q + C + F + C: 18C + Q + 5F (41C);
// - in bf16 (and fp16) the matmul operands are converted: in a forward ln_1, the attention
//   output, ln_2 and the GELU output (2C + A + F: 7C values), in a backward the four output
//   gradients (2C + Q + F: 9C), each a 4-byte read and a 2-byte write: 1.5 elements per value;
// - the LM head: the logits read twice (max, then exp and the loss) and d(logits) written: 3V,
//   plus half as much again where d(logits) is rounded into a half buffer for a half GEMM (on
//   the widened route it is rounded in place, in the same pass); ln_f 2C + 4C; the embedding
//   3C + 2C.
// - where the matmuls widen their half operands into f32 (fp16; bf16 without oneDNN bf16,
//   matmul_widened.h), each matmul's activations are widened and its half output rounded once
//   more: about the conversions above again; and each call widens its weight (12C^2 per block
//   forward, again in backward and in a recomputation), 1.5 each; the LM head's V C weight is
//   widened once a chunk in the forward and once in the backward, 2 V C ceil(N / chunk)
//   values, but a block of kWidenedWeightRows rows at a time, whose f32 copy (6 MB at width
//   768) is written and read back in the cache: only the 2-byte read, 0.5 each (measured: the
//   capped bf16 gpt2-small-test 8 x 256 step's `convert` takes 49 ms for about 0.7 G values,
//   618 M of them the head's, at an element-wise rate of 26.6 GB/s; 1.5 each would be 150 ms).
// The LLaMA family's block, counted the same way (F the rank's MLP width, QK its q and k
// widths): RMSNorm 2C twice, residual adds 3C twice, SwiGLU 3F, rotary 2 QK forward; RMSNorm 4C
// twice and its output recomputed 2C twice, residual gradients 2C twice, SwiGLU recomputed and
// differentiated 8F, rotary 2 QK backward; conversions of 2C + A + F values forward and
// 4C + A + F backward (at tp 1, 3C + F and 5C + F: GPT-2's 7C and 9C with F = 4C).
struct BlockTraffic {
  double forward, backward, half_forward, half_backward;  // elements per token
};
BlockTraffic block_traffic(const ModelConfig& c) {
  const double C = c.d_model, F = c.local_ffn(), Q = double(c.qkv_width()),
               A = double(c.attn_width());
  switch (c.family) {
    case Family::gpt2:
      return {10 * C + 2 * F, 18 * C + Q + 5 * F, (2 * C + A + F) * 1.5,
              (2 * C + Q + F) * 1.5};
    case Family::llama: {
      const double QK = double(c.local_heads() + c.local_kv_heads()) * c.head_size();
      return {10 * C + 3 * F + 2 * QK, 16 * C + 8 * F + 2 * QK, (2 * C + A + F) * 1.5,
              (4 * C + A + F) * 1.5};
    }
  }
  MEMFIT_THROW(ConfigError, "plan", "no block traffic for the {} family", family_name(c.family));
}

}  // namespace

// Note [FP8]: each cast reads its bf16 source twice (its amax, then the cast) and writes the bf16
// result, 6 bytes a value, 1.5 elements of 4: forward the linears' inputs, backward their output
// gradients and their inputs again; the weights once a forward (and recomputation) and once a
// backward.
Fp8CastTraffic fp8_cast_traffic(const ModelConfig& c) {
  const double C = c.d_model, F = c.local_ffn(), Q = double(c.qkv_width()),
               A = double(c.attn_width());
  const double fc = double(c.fc_width());
  const double inputs = C + A + C + F, outputs = Q + C + fc + C;
  return {1.5 * inputs, 1.5 * (inputs + outputs), 1.5 * double(c.block_matmul_params())};
}

double compression_traffic_bytes(const StepPlan& plan) {
  std::map<std::string, const BufferSpec*> by_tag;
  for (const BufferSpec& b : plan.buffers) by_tag.emplace(b.tag, &b);
  constexpr std::string_view kCodes = ".codes";
  double bytes = 0;
  for (const BufferSpec& b : plan.buffers) {
    if (b.category != Category::activations || !b.tag.ends_with(kCodes)) continue;
    // "h.<l>.<name>.codes": its scales and its exact values' scratch "ws.act.<name>".
    const std::string stem = b.tag.substr(0, b.tag.size() - kCodes.size());
    const size_t dot = stem.find('.', 2);
    const auto scales = by_tag.find(stem + ".scales");
    const auto value = by_tag.find("ws.act." + stem.substr(dot + 1));
    MEMFIT_CHECK(dot != std::string::npos && scales != by_tag.end() && value != by_tag.end(),
                 "plan", "compressed buffer '{}' has no scales or no scratch in the step plan",
                 b.tag);
    const double n = static_cast<double>(b.shape.numel());
    const double moved = n * (1.0 + dtype_size(value->second->dtype)) +
                         4.0 * static_cast<double>(scales->second->shape.numel());
    bytes += 2 * moved;  // quantised in the forward, restored in the backward
  }
  return bytes;
}

StepTime estimate_step_time(const StepTimeInputs& in, const Calibration& rates) {
  const ModelConfig& c = in.model;
  // The rank's vocabulary rows (padded_vocab at tp 1).
  const double N = double(in.B) * in.T, C = c.d_model, V = double(c.local_vocab());
  const Precision p = in.options.precision;
  const bool half = p != Precision::fp32;
  // Widened matmuls (fp16's always, bf16's without oneDNN bf16) run at the f32 rate.
  const bool widened = half && kernels::matmul_widens(half_dtype(p));
  const bool half_gemm = half && !widened;
  // A pipeline stage (Note [Pipeline parallel]): its blocks [first, last), the embeddings on
  // the first stage, the final norm and LM head on the last; every stage but the last runs its
  // blocks' forward once more a micro-batch, from the kept input before the backward (GPipe's
  // re-materialisation, dist/pipeline_runner.h). One stage: the whole model.
  const int first = c.pipelined() ? c.stage.first : 0;
  const int last = c.pipelined() ? c.stage.last : c.n_layer;
  const double blocks = last - first;
  const bool has_embeddings = !c.pipelined() || c.stage.has_embeddings();
  const bool has_head = !c.pipelined() || c.stage.has_head();
  const double reforward = has_head ? 0 : blocks;

  const StepFlops f = step_flops(c, in.B, in.T, in.options);
  const double head_flops = f.head;
  int recomputed = 0;
  const BlockSlots slots = block_slots(in.options.ckpt, c.n_layer);
  for (int l = first; l < last; ++l) recomputed += slots.slot[static_cast<size_t>(l)] >= 0;
  // Attention's share of step_flops: the causal scores, 4x per block with flash (backward
  // recomputes them), 3x plain, once more per recomputed block (or per block, selective plain).
  const bool flash = in.options.attention == AttentionKind::flash;
  const double scores = 2.0 * double(in.B) * in.T * in.T * double(c.attn_width());
  const double counted_attention =
      scores * (blocks * (flash ? 4 : 3) + recomputed +
                (in.options.ckpt.selective() && !flash ? blocks : 0));
  // The re-materialised forwards: each block's matmuls and scores once more.
  const double block_forward = 2.0 * N * double(c.block_matmul_params());

  StepTime t;
  t.block_gemm = (f.total - head_flops - counted_attention + reforward * block_forward) /
                 rates.block_rate(half_gemm, c.d_model);
  t.attention = (counted_attention + reforward * scores) /
                (half_dtype(p) == DType::bf16 ? rates.attention_bf16 : rates.attention_f32);
  t.head_gemm = head_flops / rates.head_rate(half_gemm, c.d_model);

  const BlockTraffic b = block_traffic(c);
  const double forward = b.forward + (half ? b.half_forward : 0);
  const double backward = b.backward + (half ? b.half_backward : 0);
  // The head's softmax and ln_f (6C) on the last stage, the embedding (5C) on the first; a
  // stage without them copies its input in and its output out (2C each).
  double per_token = blocks * (forward + backward) + (recomputed + reforward) * forward +
                     (has_head ? (half_gemm ? 4.5 : 3.0) * V + 6 * C : 2 * C) +
                     (has_embeddings ? 5 * C : 2 * C);
  double per_micro_batch = 0;  // elements converted once per micro-batch, not per token
  if (widened) {
    per_token += (blocks + recomputed + reforward) * b.half_forward + blocks * b.half_backward;
    const double chunks = std::ceil(N / double(lm_head_rows(in.options, int64_t(N))));
    per_micro_batch =
        1.5 * double(c.block_matmul_params()) * (2 * blocks + recomputed + reforward) +
        (has_head ? 0.5 * 2 * chunks * V * C : 0);
  }
  if (p == Precision::fp8) {
    const Fp8CastTraffic f8 = fp8_cast_traffic(c);
    per_token += (blocks + recomputed + reforward) * f8.forward + blocks * f8.backward;
    per_micro_batch += f8.weight * (2 * blocks + recomputed + reforward);
  }
  t.elementwise = (per_token * N + per_micro_batch) * 4 / rates.elementwise_bytes_per_s;
  // --act-compress: its passes stream their bytes as the element-wise kernels do (each block of
  // 64 values is read twice, the second time from L1).
  t.compression = in.compression_bytes / rates.elementwise_bytes_per_s;

  // The update reads the gradient and reads and writes the weights of record and the state;
  // zero_grad writes the gradient (once a step; with --update-in-backward once a pass, as each
  // pass zeroes the unit buffers) and clipping reads it; a mixed-precision run also writes its
  // half working copy.
  // Under ZeRO (stage 1 on) the update covers this rank's shard U (the all-gather of the
  // others' is comm); clipping reads the gradients whose squares this rank sums.
  const double P = double(in.param_count);
  const double U = in.update_params ? double(in.update_params) : P;
  const double norm = in.norm_params ? double(in.norm_params) : P;
  const double weights = half && in.master_weights ? 4 : double(dtype_size(half_dtype(p)));
  const double zeroings = in.update_in_backward ? in.backward_passes : 1;
  double bytes =
      2.0 * in.optimizer_bytes + 2.0 * weights * U + 4 * U + 4 * P * zeroings + 4 * norm;
  if (half && in.master_weights) bytes += 2.0 * U;
  t.optimizer = bytes / rates.stream_bytes_per_s;
  if (in.optimizer_flops > 0) t.optimizer += in.optimizer_flops / rates.block_rate(false, c.d_model);
  // Each rank sends half the bytes it copies (CommVolume::copied_bytes: every byte sent and
  // received copied once), on the data group's link.
  if (in.comm_copied_bytes > 0)
    t.comm = link_seconds(in.data_link, in.comm_copied_bytes / 2, in.comm_messages, rates) +
             in.comm_summed_bytes / rates.stream_bytes_per_s;
  t.tensor_comm = tensor_comm_seconds(in.tensor_comm, c.tp, rates, in.tensor_link);  // per step
  if (in.tp_overlap && c.tp > 1 && in.options.lora_rank == 0) {
    // --tp-overlap: each block backward's qkv and fc d(input) sums (N x C f32 each: all-reduces,
    // reduce-scatters under --sp) beside their weight-gradient GEMMs (2 N C out FLOPs).
    TensorCommVolume one;
    const int64_t whole = int64_t(N) * c.d_model * int64_t{sizeof(float)};
    (in.options.sequence_parallel ? one.reduce_scatter_bytes : one.all_reduce_bytes) = whole;
    (in.options.sequence_parallel ? one.reduce_scatter_count : one.all_reduce_count) = 1;
    const double sum = tensor_comm_seconds(one, c.tp, rates, in.tensor_link);
    const double rate = rates.block_rate(half_gemm, c.d_model);
    double hidden = 0;
    for (const double out : {double(c.qkv_width()), double(c.fc_width())})
      hidden += std::min(sum, 2 * N * C * out / rate);
    t.tensor_comm_hidden = std::min(t.tensor_comm,
                                    hidden * blocks * in.grad_accum * in.backward_passes);
    t.tensor_comm -= t.tensor_comm_hidden;
  }
  // The update's I/O runs while it computes, piece by piece through a ring of three slots,
  // and nothing else runs meanwhile: after the backward, or with --update-in-backward inside
  // it, unit by unit, the backward waiting for each unit's update (offloaded_unit_pass.cpp
  // reads two pieces ahead, not a unit), so in both only its excess over the update's compute
  // lengthens the step.
  t.offload_io = std::max(0.0, in.offload_io_seconds - t.optimizer);

  const int passes = in.grad_accum * in.backward_passes;
  t.block_gemm *= passes;
  t.attention *= passes;
  t.head_gemm *= passes;
  t.elementwise *= passes;
  t.compression *= passes;
  // --offload-params: each block is read once for the forward and once for the backward (its
  // recomputation shares that read), while the blocks before it compute: half the reads hide
  // behind the forward's compute, half behind the backward's (a third of the FLOPs left after
  // recomputation is forward). --offload-grads: the backward's writes and reads back of the
  // gradients share the disk with the backward's block reads. Each phase is as long as the
  // longer of its compute and its disk time (measured at 7B with --ckpt full: the forward reads
  // twice as long as it computes, so the forward is the disk's; Note [Step-time model]).
  const double compute = t.block_gemm + t.attention + t.head_gemm + t.elementwise +
                         t.compression;
  const double forward_share = f.total > 0 ? (f.total - f.recompute) / 3.0 / f.total : 1.0 / 3;
  const double forward_compute = compute * forward_share;
  const double backward_compute = compute - forward_compute;
  t.offload_io += std::max(0.0, in.param_read_seconds / 2 - forward_compute) +
                  std::max(0.0, in.param_read_seconds / 2 + in.offload_backward_io_seconds -
                                    backward_compute);
  return t;
}

double ring_messages(const dist::CommVolume& v, int world, size_t bucket_bytes) {
  if (world <= 1) return 0;
  auto buckets = [&](int64_t bytes) {
    if (bytes <= 0) return 0.0;
    return bucket_bytes > 0 ? std::ceil(double(bytes) / double(bucket_bytes)) : 1.0;
  };
  return (world - 1.0) *
         (2 * buckets(v.all_reduce) + buckets(v.reduce_scatter) + buckets(v.all_gather));
}

}  // namespace memfit
