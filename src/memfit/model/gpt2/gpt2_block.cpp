#include "memfit/model/gpt2/gpt2_block.h"

#include <algorithm>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/gelu.h"
#include "memfit/kernels/cpu/layernorm.h"
#include "memfit/kernels/cpu/residual.h"

namespace memfit {

using namespace kernels;

// ws.gelu's width: the GELU's (the MLP's), and in the backward the recomputed LayerNorm output
// (C) beside d(qkv): 4C both ways in the whole model; under tensor parallelism the rank's MLP
// and q|k|v widths are a share of them, so the wider of the two (Note [Tensor parallel]).
static int64_t gpt2_gelu_width(const ModelConfig& c) {
  return std::max(c.fc_width(), c.d_model + c.qkv_width());
}

// The buffers come first, each with how the phase first uses it: that half is the block's
// description, which planning records (Note [One step description]). Matmul operands and what
// is saved for them are in h (f32, bf16 or f16); the residual stream and LayerNorm statistics
// stay f32. The GELU output is not kept: backward recomputes it from the saved pre-activation
// (one cheap pass per layer that saves 4C values per token, a quarter of the block's
// activations), together with its derivative (gelu_recompute_backward: one tanh, not two).
// Nor are the two LayerNorm outputs: backward recomputes each from the block's
// input or residual_2 and the saved mean and rstd with layernorm_apply, the forward's
// arithmetic element by element, so FP32 is bit for bit what a saved copy would give (Note
// [Recomputed norms]). ws.dC and ws.gelu are free during the forward, so they hold the
// projections' outputs, the LayerNorm outputs (in the first C columns of ws.gelu, which GELU
// overwrites only after the last one is read) and the GELU. Keep::compressible marks what --act-compress may store in 8 bits in a
// block that keeps its activations (Note [Activation compression]); the code reads and writes
// the same tensors either way.
//
// Under --sp (Note [Sequence parallel]) x, residual_2, the output and the LayerNorm statistics
// hold this rank's stream_rows(); each LayerNorm writes this rank's rows of its whole output,
// which the gather then completes before the column-parallel linear reads it, and the
// row-parallel linears leave the group's sum in this rank's rows of ws.dC (s.mine(proj)).
void gpt2_block_forward(BlockStep& s) {
  const int B = s.B, T = s.T;
  const int64_t C = s.config.d_model, N = s.stream_rows();
  const int64_t Q = s.config.qkv_width(), A = s.config.attn_width(), F = s.config.fc_width();
  const DType h = s.h, f32 = DType::f32;
  Tensor x = s.input();
  const Keep z = Keep::compressible;  // under --act-compress (Note [Activation compression])
  Tensor ln1_mean = s.save("ln_1.mean", {N}, f32), ln1_rstd = s.save("ln_1.rstd", {N}, f32);
  Tensor qkv = s.save("qkv", {B, T, Q}, h, z);
  BlockStep::Attention att = s.attention_save();
  Tensor atty = s.save("atty", {B, T, A}, h, z);
  Tensor r2 = s.save("residual_2", s.stream_shape(), f32, z);
  Tensor ln2_mean = s.save("ln_2.mean", {N}, f32), ln2_rstd = s.save("ln_2.rstd", {N}, f32);
  Tensor fch = s.save("fch", {B, T, F}, h, z);
  Tensor r3 = s.output();
  Tensor proj = s.scratch("ws.dC", {B, T, C}, f32);
  Tensor gelu_ws = s.scratch("ws.gelu", {B, T, gpt2_gelu_width(s.config)}, h);
  s.matmuls();
  if (!s.running()) return;
  Tensor ln1 = gelu_ws.view(0, {B, T, C}), ln2 = ln1;  // LayerNorm outputs, not kept
  Tensor gelu = gelu_ws.view(0, {B, T, F});
  Tensor ln_mine = s.mine(ln1), proj_mine = s.mine(proj);  // the whole ones without --sp

  const BlockWeights& w = s.w;
  layernorm_forward(ln_mine, ln1_mean, ln1_rstd, x, w.norm1_w, w.norm1_b);
  s.gather(ln1);
  s.linear_forward(LinearSlot::qkv, qkv, ln1, w.qkv_w, w.qkv_b);
  s.attention_forward(atty, att, qkv);
  s.linear_forward(LinearSlot::attn_out, proj, atty, w.attn_out_w, w.attn_out_b);
  residual_forward(r2, x, proj_mine);
  layernorm_forward(ln_mine, ln2_mean, ln2_rstd, r2, w.norm2_w, w.norm2_b);
  s.gather(ln2);
  s.linear_forward(LinearSlot::fc, fch, ln2, w.fc_w, w.fc_b);
  gelu_forward(gelu, fch);
  s.linear_forward(LinearSlot::mlp_out, proj, gelu, w.mlp_out_w, w.mlp_out_b);
  residual_forward(r3, r2, proj_mine);
}

// ws.dresidual holds d(output) and becomes d(input): the skip paths pass it on unchanged and
// each LayerNorm's backward adds its branch into it. In bf16/fp16 a rounded copy of it is the
// projections' dout, and d(atty) is computed straight into the attention backward's type.
// Under --sp dres holds this rank's rows: gathered into ws.sp.whole before each row-parallel
// backward, the recomputed LayerNorm outputs gathered before each column-parallel one, whose
// d(input) leaves the group's sum in this rank's rows of ws.dC.
void gpt2_block_backward(BlockStep& s) {
  const int B = s.B, T = s.T;
  const int64_t C = s.config.d_model;
  const int64_t Q = s.config.qkv_width(), A = s.config.attn_width(), F = s.config.fc_width();
  const DType h = s.h, f32 = DType::f32;
  const bool mixed = s.mixed();
  const Keep z = Keep::compressible;
  Tensor gelu_ws = s.scratch("ws.gelu", {B, T, gpt2_gelu_width(s.config)}, h);  // from fch
  Tensor fch = s.saved("fch", z);
  Tensor dres = s.scratch_read("ws.dresidual");
  Tensor dres_h = mixed ? s.scratch("ws.dresidual.half", s.stream_shape(), h) : dres;
  Tensor dout_ws = s.dout_buffer(dres_h);  // --sp: the row-parallel linears' whole d(output)
  Tensor d4C = s.scratch("ws.d4C", {B, T, F}, h);
  Tensor dC = s.scratch("ws.dC", {B, T, C}, f32);
  Tensor r2 = s.saved("residual_2", z),
         ln2_mean = s.saved("ln_2.mean"), ln2_rstd = s.saved("ln_2.rstd"),
         atty = s.saved("atty", z), qkv = s.saved("qkv", z);
  // d(atty) in f32: the first (B, T, A) of ws.dC (A = C without --tp).
  Tensor datty = mixed ? s.scratch("ws.dC.half", {B, T, A}, h) : dC;
  BlockStep::Attention att = s.attention_grad_buffers();
  Tensor ln1_mean = s.saved("ln_1.mean"), ln1_rstd = s.saved("ln_1.rstd");
  Tensor x = s.input();
  s.matmuls();
  if (!s.running()) return;
  if (!mixed) datty = dC.view(0, {B, T, A});
  // The LayerNorm outputs, recomputed where they are read: ws.gelu is free once the MLP's
  // output projection has read the GELU. Its other 3C columns take d(qkv) (no scratch of its
  // own: 3C values a token less workspace in the backward, where the fp32 arena peaks).
  Tensor ln1 = gelu_ws.view(0, {B, T, C}), ln2 = ln1;
  Tensor dqkv = gelu_ws.view(int64_t{B} * T * C, {B, T, Q});
  Tensor gelu = gelu_ws.view(0, {B, T, F});
  Tensor ln_mine = s.mine(ln1), dC_mine = s.mine(dC);  // the whole ones without --sp

  const BlockWeights &w = s.w, &g = s.g;
  Tensor dn2w = g.norm2_w, dn2b = g.norm2_b, dn1w = g.norm1_w, dn1b = g.norm1_b;
  auto round_dres = [&] {
    if (mixed) convert(dres_h, dres);
  };
  // MLP: dres is d(residual_3) and flows on unchanged to residual_2 through the skip path.
  round_dres();
  // d(GELU) first (the GELU is only the shape here), then the GELU and its derivative in one
  // pass (one tanh per element, not two), then d(weight) from the GELU: the same bits.
  Tensor dout = s.gathered_dout(dres_h, dout_ws);
  s.linear_backward_around(LinearSlot::mlp_out, d4C, g.mlp_out_w, g.mlp_out_b, dout, gelu,
                           w.mlp_out_w, [&] { gelu_recompute_backward(gelu, d4C, fch); });
  layernorm_apply(ln_mine, r2, w.norm2_w, w.norm2_b, ln2_mean, ln2_rstd);
  s.gather(ln2);
  s.linear_backward(LinearSlot::fc, dC, g.fc_w, g.fc_b, d4C, ln2, w.fc_w);
  layernorm_backward(dres, dn2w, dn2b, dC_mine, r2, w.norm2_w, ln2_mean, ln2_rstd);
  // Attention: dres is now d(residual_2) and flows on to x. d4C is free again: it takes
  // selective checkpointing's recomputed attention output.
  round_dres();
  dout = s.gathered_dout(dres_h, dout_ws);
  s.linear_backward(LinearSlot::attn_out, datty, g.attn_out_w, g.attn_out_b, dout, atty,
                    w.attn_out_w);
  s.attention_backward(dqkv, datty, qkv, atty, att, d4C.view(0, {B, T, A}));
  layernorm_apply(ln_mine, x, w.norm1_w, w.norm1_b, ln1_mean, ln1_rstd);
  s.gather(ln1);
  s.linear_backward(LinearSlot::qkv, dC, g.qkv_w, g.qkv_b, dqkv, ln1, w.qkv_w);
  layernorm_backward(dres, dn1w, dn1b, dC_mine, x, w.norm1_w, ln1_mean, ln1_rstd);
}

}  // namespace memfit
