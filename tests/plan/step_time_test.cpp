// The step-time model's term for --act-compress (Note [Step-time model], Note [Activation
// compression]): the bytes the (de)quantisation passes move, read from the step plan, against a
// count made here from the block's description; the term is those bytes at the element-wise
// rate, once per micro-batch, and nothing without compression.
#include "memfit/plan/step_time.h"

#include <gtest/gtest.h>

#include "memfit/kernels/cpu/act_quant.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/step_plan.h"
#include "memfit/optim/optimizer.h"

namespace memfit {
namespace {

Calibration some_rates() {
  Calibration r;
  r.gemm = {{384, 1e11, 1e11, 2e11, 2e11}, {768, 1.2e11, 1.2e11, 2.4e11, 2.4e11}};
  r.attention_f32 = 5e10;
  r.attention_bf16 = 8e10;
  r.elementwise_bytes_per_s = 1e10;
  r.stream_bytes_per_s = 2e10;
  r.copy_bytes_per_s = 1e10;
  return r;
}

// gpt2-tiny's inputs at B x T tokens (1000 parameters: the optimizer term is not under test).
StepTimeInputs tiny_inputs(int B, int T) {
  StepTimeInputs in;
  in.model = ModelConfig::preset("gpt2-tiny");
  in.model.finalize();
  in.B = B;
  in.T = T;
  in.param_count = 1000;
  return in;
}

// Quantised once and restored once: n values of `value_bytes` each, one byte of code each, and
// a 4-byte scale per 64.
double passes(double n, double value_bytes) {
  return 2 * (n * (1 + value_bytes) + 4.0 * double(kernels::act_blocks(int64_t(n))));
}

TEST(StepTime, CompressionTrafficIsCountedFromThePlan) {
  const ModelConfig c = ModelConfig::preset("gpt2");
  const int B = 2, T = 64;
  const double N = double(B) * T, C = c.d_model;
  ActivationOptions o;
  o.precision = Precision::bf16;
  EXPECT_EQ(compression_traffic_bytes(plan_step(c, B, T, o)), 0.0);
  for (ActCompress z : {ActCompress::int8, ActCompress::fp8}) {
    o.act_compress = z;
    // Each kept block: qkv (3C), the attention output (C) and the GELU input (4C) in bf16; the
    // saved residual (C) in f32. The LayerNorm outputs are recomputed, not saved.
    const double block = passes(N * C, 2) + passes(N * 3 * C, 2) + passes(N * 4 * C, 2) +
                         passes(N * C, 4);
    o.ckpt = CheckpointPolicy::parse("none");
    EXPECT_DOUBLE_EQ(compression_traffic_bytes(plan_step(c, B, T, o)), c.n_layer * block);
    o.ckpt = CheckpointPolicy::parse("layers:0-9");  // 10 recomputed, 2 kept
    EXPECT_DOUBLE_EQ(compression_traffic_bytes(plan_step(c, B, T, o)), 2 * block);
    o.ckpt = CheckpointPolicy::parse("full");
    EXPECT_EQ(compression_traffic_bytes(plan_step(c, B, T, o)), 0.0);
  }
}

TEST(StepTime, CompressionTermIsItsBytesAtTheElementwiseRate) {
  StepTimeInputs in = tiny_inputs(4, 32);
  in.grad_accum = 3;
  const Calibration rates = some_rates();
  const StepTime plain = estimate_step_time(in, rates);
  EXPECT_EQ(plain.compression, 0.0);
  in.compression_bytes = 5e8;
  const StepTime comp = estimate_step_time(in, rates);
  EXPECT_DOUBLE_EQ(comp.compression, 3 * 5e8 / rates.elementwise_bytes_per_s);
  EXPECT_DOUBLE_EQ(comp.total(), plain.total() + comp.compression);
}

// APOLLO's projections (Note [APOLLO]): 2 r m n FLOPs a projected matrix, priced at the f32
// GEMM rate of the model's width, once a step whatever the accumulation.
TEST(StepTime, TheUpdatesGemmFlopsAreAtTheF32GemmRate) {
  StepTimeInputs in = tiny_inputs(2, 32);
  in.grad_accum = 2;
  const Calibration rates = some_rates();
  const StepTime plain = estimate_step_time(in, rates);
  const ParamLayout layout(in.model);
  OptimConfig oc;
  oc.name = "apollo";
  oc.rank = 8;
  in.optimizer_flops = optimizer_update_flops(oc, layout);
  double want = 0;  // gpt2-tiny: per layer c_attn, attn.c_proj, c_fc, mlp.c_proj
  const double C = in.model.d_model;
  for (int l = 0; l < in.model.n_layer; ++l) want += 2 * 8 * (3 * C * C + C * C + 4 * C * C * 2);
  EXPECT_DOUBLE_EQ(in.optimizer_flops, want);
  const StepTime apollo = estimate_step_time(in, rates);
  EXPECT_DOUBLE_EQ(apollo.optimizer - plain.optimizer,
                   want / rates.block_rate(false, in.model.d_model));
  oc.name = "adamw";
  oc.rank = 0;
  EXPECT_EQ(optimizer_update_flops(oc, layout), 0.0);
  // GaLore: the projection and back (4 r m n) and the SVD (2 l s^2 + 11 s^3, l and s the larger
  // and smaller side) once per projection gap.
  oc.name = "galore";
  oc.rank = 8;
  oc.proj_gap = 10;
  auto svd = [](double l, double s) { return 2 * l * s * s + 11 * s * s * s; };
  double galore = 0;
  for (int l = 0; l < in.model.n_layer; ++l)
    galore += 4 * 8 * (3 * C * C + C * C + 4 * C * C * 2) +
              (svd(3 * C, C) + svd(C, C) + 2 * svd(4 * C, C)) / 10;
  EXPECT_NEAR(optimizer_update_flops(oc, layout), galore, 1e-12 * galore);
}

// The gradient's zeroing (4 bytes a parameter at the streaming rate) in the optimizer term:
// zero_grad once a step however many micro-batches; with --update-in-backward once a pass, as
// each pass zeroes the unit buffers it opens (optim/backward_update.cpp), so the same as the
// ordinary step's in one pass and twice in global clipping's two.
TEST(StepTime, TheGradientIsZeroedOnceAStepOrOnceAPassInTheBackward) {
  StepTimeInputs in = tiny_inputs(2, 32);
  const Calibration rates = some_rates();
  const double zeroing = 4.0 * double(in.param_count) / rates.stream_bytes_per_s;
  const StepTime ordinary = estimate_step_time(in, rates);
  ASSERT_GT(ordinary.optimizer, zeroing);
  in.grad_accum = 3;
  EXPECT_DOUBLE_EQ(estimate_step_time(in, rates).optimizer, ordinary.optimizer);
  in.grad_accum = 1;
  in.update_in_backward = true;
  EXPECT_DOUBLE_EQ(estimate_step_time(in, rates).optimizer, ordinary.optimizer);
  in.backward_passes = 2;
  const StepTime two = estimate_step_time(in, rates);
  EXPECT_DOUBLE_EQ(two.optimizer, ordinary.optimizer + zeroing);
  in.update_in_backward = false;  // the passes alone add no zeroing
  EXPECT_DOUBLE_EQ(estimate_step_time(in, rates).optimizer, ordinary.optimizer);
}

// Offload: the update's disk time beyond its compute adds to the step whether the update runs
// after the backward or inside it (the backward waits for each unit's update: the ring reads two
// pieces ahead, not a unit); the blocks' reads hide half behind the forward's compute and half
// behind the backward's, so a forward shorter than its reads lengthens the step even when the
// backward hides its half.
TEST(StepTime, TheUpdatesDiskTimeAddsAndTheBlockReadsHideBehindEachPhase) {
  StepTimeInputs in = tiny_inputs(2, 32);
  const Calibration rates = some_rates();
  const StepTime t = estimate_step_time(in, rates);
  const double compute = t.block_gemm + t.attention + t.head_gemm + t.elementwise;
  ASSERT_GT(compute, t.optimizer);
  in.offload_io_seconds = t.optimizer + compute / 2;  // the update waits for it
  EXPECT_NEAR(estimate_step_time(in, rates).offload_io, compute / 2, 1e-12);
  in.update_in_backward = true;  // inside the backward: the same wait
  EXPECT_NEAR(estimate_step_time(in, rates).offload_io, compute / 2, 1e-12);
  in.offload_io_seconds = 0;
  // No recomputation: the forward is a third of the compute.
  const double forward = compute / 3, backward = compute - forward;
  in.param_read_seconds = 2 * forward;  // each half fits its phase
  EXPECT_NEAR(estimate_step_time(in, rates).offload_io, 0.0, 1e-12);
  in.param_read_seconds = 2 * backward;  // the forward's half exceeds it, the backward's fits
  EXPECT_NEAR(estimate_step_time(in, rates).offload_io, backward - forward, 1e-12);
  in.offload_backward_io_seconds = forward;  // the gradients' I/O shares the backward's disk
  EXPECT_NEAR(estimate_step_time(in, rates).offload_io, backward, 1e-12);
}

// Where the matmuls widen (fp16 always), the LM head's (Vp, C) weight is widened once a chunk
// in the forward and once in the backward (matmul_widened_blocked), its 2-byte read counted (0.5
// elements a value: the widened block stays in the cache): the element-wise term moves by
// exactly that when the chunk halves. Elsewhere the chunk moves nothing.
TEST(StepTime, TheWidenedHeadWidensItsWeightTwiceAChunk) {
  StepTimeInputs in = tiny_inputs(4, 64);  // 256 rows: 1 chunk of 256, 2 of 128, 4 of 64
  const Calibration rates = some_rates();
  const double VC = double(in.model.padded_vocab) * in.model.d_model;
  auto elementwise = [&](Precision p, int chunk) {
    in.options.precision = p;
    in.options.lm_head_chunk = chunk;
    return estimate_step_time(in, rates).elementwise;
  };
  const double per_widening = 0.5 * 2 * VC * 4 / rates.elementwise_bytes_per_s;
  const double tol = 1e-9 * per_widening;  // the difference of two sums of many terms
  EXPECT_NEAR(elementwise(Precision::fp16, 128) - elementwise(Precision::fp16, 256),
              per_widening, tol);
  EXPECT_NEAR(elementwise(Precision::fp16, 64) - elementwise(Precision::fp16, 256),
              3 * per_widening, tol);
  EXPECT_NEAR(elementwise(Precision::fp16, 100) - elementwise(Precision::fp16, 256),
              2 * per_widening, tol);  // ceil(256 / 100) = 3 chunks
  EXPECT_EQ(elementwise(Precision::fp32, 64), elementwise(Precision::fp32, 256));
}

// --precision fp8 (Note [FP8]): bf16's GEMM and attention terms, and an element-wise term larger
// by exactly the casts' traffic: gpt2-tiny's linears read inputs of 7C and write outputs of 9C
// values a token, 6 bytes a cast value; each weight (12 C^2 a block) cast once a forward and
// once a backward (widened or not: bf16's widening terms are fp8's too).
TEST(StepTime, Fp8IsBf16PlusItsCasts) {
  StepTimeInputs in = tiny_inputs(2, 32);
  const Calibration rates = some_rates();
  in.options.precision = Precision::bf16;
  const StepTime bf = estimate_step_time(in, rates);
  in.options.precision = Precision::fp8;
  const StepTime f8 = estimate_step_time(in, rates);
  EXPECT_EQ(f8.block_gemm, bf.block_gemm);
  EXPECT_EQ(f8.attention, bf.attention);
  EXPECT_EQ(f8.head_gemm, bf.head_gemm);
  const ModelConfig& c = in.model;
  const double C = c.d_model, L = c.n_layer, N = 2 * 32;
  const double bytes = 6 * N * L * (7 * C + (7 * C + 9 * C)) + 6 * 12 * C * C * 2 * L;
  const double tol = 1e-9 * bf.elementwise;
  EXPECT_NEAR(f8.elementwise - bf.elementwise, bytes / rates.elementwise_bytes_per_s, tol);
}

// --tp (Note [Tensor parallel]): every term in one rank's widths at a fixed shape. gpt2 (12 x
// 768, 12 heads) at tp 2: a rank's block GEMMs, attention and LM head (its vocabulary rows) are
// half the whole model's; its element-wise traffic a token keeps the norms and residual stream
// whole and the rest at the rank's widths (F the MLP's, Q the q|k|v's, V the head's rows); the
// tensor collectives are their own term, per step whatever the accumulation.
TEST(StepTime, UnderTensorParallelismEveryTermIsOneRanksWidths) {
  StepTimeInputs one;
  one.model = ModelConfig::preset("gpt2");
  one.B = 2;
  one.T = 128;
  one.param_count = 1000;
  StepTimeInputs two = one;
  two.model.set_tensor_parallel(2);
  const Calibration rates = some_rates();
  const StepTime a = estimate_step_time(one, rates), b = estimate_step_time(two, rates);
  EXPECT_NEAR(b.block_gemm, a.block_gemm / 2, 1e-12 * a.block_gemm);
  EXPECT_NEAR(b.attention, a.attention / 2, 1e-12 * a.attention);
  const double V1 = double(one.model.padded_vocab), V2 = double(two.model.local_vocab());
  EXPECT_EQ(V2, V1 / 2);  // 50257 padded to 2 x 64: 50304, 25152 a rank
  EXPECT_NEAR(b.head_gemm, a.head_gemm / 2, 1e-12 * a.head_gemm);
  const double C = 768, L = 12, N = 2 * 128;
  auto per_token = [&](double F, double Q, double V) {
    return L * ((10 * C + 2 * F) + (18 * C + Q + 5 * F)) + 3 * V + 6 * C + 5 * C;
  };
  const double to_s = N * 4 / rates.elementwise_bytes_per_s;
  EXPECT_NEAR(a.elementwise, per_token(4 * C, 3 * C, V1) * to_s, 1e-12 * a.elementwise);
  EXPECT_NEAR(b.elementwise, per_token(2 * C, 1.5 * C, V2) * to_s, 1e-12 * a.elementwise);
  EXPECT_EQ(a.tensor_comm, 0.0);
  EXPECT_EQ(b.tensor_comm, 0.0);  // no collectives given
  two.tensor_comm.all_reduce_count = 50;
  two.tensor_comm.all_reduce_bytes = 50 * int64_t{2 * 128 * 768 * 4};
  two.tensor_comm.gathered_bytes = 5136;
  const StepTime c = estimate_step_time(two, rates);
  EXPECT_DOUBLE_EQ(c.tensor_comm, tensor_comm_seconds(two.tensor_comm, 2, rates));
  EXPECT_GT(c.tensor_comm, 0.0);
  EXPECT_DOUBLE_EQ(c.total(), b.total() + c.tensor_comm);
  two.grad_accum = 3;  // the volume is the step's already
  EXPECT_DOUBLE_EQ(estimate_step_time(two, rates).tensor_comm, c.tensor_comm);
}

}  // namespace
}  // namespace memfit
