#include "memfit/model/llama/llama_block.h"

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/residual.h"
#include "memfit/kernels/cpu/rmsnorm.h"
#include "memfit/kernels/cpu/rope.h"
#include "memfit/kernels/cpu/swiglu.h"

namespace memfit {

using namespace kernels;

// As gpt2_block.cpp: the buffers first (the block's description), then the kernels. The saved
// qkv holds q and k after the rotation, which is what the attention backward reads; the
// rotation's backward is the inverse rotation of dq and dk, in place, so it needs nothing
// saved. The SwiGLU output is recomputed in backward from the saved gate|up, as GPT-2's GELU.
// The rotary table ("rope", (T, head size) f32) is written once per micro-batch by the
// embedding phase (transformer_step.cpp). The two RMSNorm outputs are not kept: backward
// recomputes them from the block's input or residual_2 and the saved rstd with rmsnorm_apply,
// bit for bit the forward's (Note [Recomputed norms]); they live in "ws.norm", one (B, T, C)
// scratch of type h (the MLP's scratch may be narrower than C here, unlike GPT-2's).
// Keep::compressible as in gpt2_block.cpp; --sp as there (Note [Sequence parallel]): the
// stream and the RMSNorm statistics this rank's stream_rows(), ws.norm gathered whole.
void llama_block_forward(BlockStep& s) {
  const int B = s.B, T = s.T;
  const int64_t C = s.config.d_model, N = s.stream_rows(), F = s.config.local_ffn();
  const int64_t A = s.config.attn_width();  // this rank's heads under --tp
  const DType h = s.h, f32 = DType::f32;
  Tensor x = s.input();
  const Keep z = Keep::compressible;  // under --act-compress (Note [Activation compression])
  Tensor n1_rstd = s.save("attn_norm.rstd", {N}, f32);
  Tensor qkv = s.save("qkv", {B, T, s.config.qkv_width()}, h, z);
  Tensor rope = s.ctx.read("rope");
  BlockStep::Attention att = s.attention_save();
  Tensor atty = s.save("atty", {B, T, A}, h, z);
  Tensor r2 = s.save("residual_2", s.stream_shape(), f32, z);
  Tensor n2_rstd = s.save("mlp_norm.rstd", {N}, f32);
  Tensor gate_up = s.save("gate_up", {B, T, 2 * F}, h, z);
  Tensor r3 = s.output();
  Tensor proj = s.scratch("ws.dC", {B, T, C}, f32), act = s.scratch("ws.swiglu", {B, T, F}, h);
  Tensor n1 = s.scratch("ws.norm", {B, T, C}, h), n2 = n1;  // RMSNorm outputs, not kept
  s.matmuls();
  if (!s.running()) return;

  const BlockWeights& w = s.w;
  const float eps = s.config.norm_eps;
  Tensor none, norm_mine = s.mine(n1), proj_mine = s.mine(proj);  // whole without --sp
  rmsnorm_forward(norm_mine, n1_rstd, x, w.norm1_w, eps);
  s.gather(n1);
  s.linear_forward(LinearSlot::qkv, qkv, n1, w.qkv_w, none);
  rope_forward(qkv, rope, s.heads());
  s.attention_forward(atty, att, qkv);
  s.linear_forward(LinearSlot::attn_out, proj, atty, w.attn_out_w, none);
  residual_forward(r2, x, proj_mine);
  rmsnorm_forward(norm_mine, n2_rstd, r2, w.norm2_w, eps);
  s.gather(n2);
  s.linear_forward(LinearSlot::fc, gate_up, n2, w.fc_w, none);
  swiglu_forward(act, gate_up);
  s.linear_forward(LinearSlot::mlp_out, proj, act, w.mlp_out_w, none);
  residual_forward(r3, r2, proj_mine);
}

// ws.dresidual holds d(output) and becomes d(input), as in gpt2_block_backward (--sp too).
void llama_block_backward(BlockStep& s) {
  const int B = s.B, T = s.T;
  const int64_t C = s.config.d_model, F = s.config.local_ffn(), A = s.config.attn_width();
  const DType h = s.h, f32 = DType::f32;
  const bool mixed = s.mixed();
  const Keep z = Keep::compressible;
  Tensor act = s.scratch("ws.swiglu", {B, T, F}, h);  // recomputed from gate_up
  Tensor gate_up = s.saved("gate_up", z);
  Tensor dres = s.scratch_read("ws.dresidual");
  Tensor dres_h = mixed ? s.scratch("ws.dresidual.half", s.stream_shape(), h) : dres;
  Tensor dout_ws = s.dout_buffer(dres_h);  // --sp: the row-parallel linears' whole d(output)
  Tensor dact = s.scratch("ws.dswiglu", {B, T, F}, h);
  Tensor dgate_up = s.scratch("ws.dgate_up", {B, T, 2 * F}, h);
  Tensor dC = s.scratch("ws.dC", {B, T, C}, f32);
  Tensor n2 = s.scratch("ws.norm", {B, T, C}, h), n1 = n2;  // recomputed where read
  Tensor r2 = s.saved("residual_2", z),
         n2_rstd = s.saved("mlp_norm.rstd"), atty = s.saved("atty", z), qkv = s.saved("qkv", z);
  // d(atty) in f32: the first (B, T, A) of ws.dC (A = C without --tp).
  Tensor datty = mixed ? s.scratch("ws.dC.half", {B, T, A}, h) : dC;
  BlockStep::Attention att = s.attention_grad_buffers();
  Tensor dqkv = s.scratch("ws.dqkv", {B, T, s.config.qkv_width()}, h);
  Tensor rope = s.ctx.read("rope");
  Tensor n1_rstd = s.saved("attn_norm.rstd");
  Tensor x = s.input();
  s.matmuls();
  if (!s.running()) return;
  if (!mixed) datty = dC.view(0, {B, T, A});

  const BlockWeights &w = s.w, &g = s.g;
  Tensor dn2 = g.norm2_w, dn1 = g.norm1_w, none;
  Tensor norm_mine = s.mine(n2), dC_mine = s.mine(dC);  // the whole ones without --sp
  auto round_dres = [&] {
    if (mixed) convert(dres_h, dres);
  };
  // MLP: dres is d(residual_3) and flows on unchanged to residual_2 through the skip path.
  swiglu_forward(act, gate_up);
  round_dres();
  Tensor dout = s.gathered_dout(dres_h, dout_ws);
  s.linear_backward(LinearSlot::mlp_out, dact, g.mlp_out_w, none, dout, act, w.mlp_out_w);
  swiglu_backward(dgate_up, dact, gate_up);
  rmsnorm_apply(norm_mine, r2, w.norm2_w, n2_rstd);
  s.gather(n2);
  s.linear_backward(LinearSlot::fc, dC, g.fc_w, none, dgate_up, n2, w.fc_w);
  rmsnorm_backward(dres, dn2, dC_mine, r2, w.norm2_w, n2_rstd);
  // Attention: dres is now d(residual_2) and flows on to x. dgate_up is free again: it takes
  // selective checkpointing's recomputed attention output.
  round_dres();
  dout = s.gathered_dout(dres_h, dout_ws);
  s.linear_backward(LinearSlot::attn_out, datty, g.attn_out_w, none, dout, atty,
                    w.attn_out_w);
  s.attention_backward(dqkv, datty, qkv, atty, att, dgate_up.view(0, atty.shape()));
  rope_backward(dqkv, rope, s.heads());
  rmsnorm_apply(norm_mine, x, w.norm1_w, n1_rstd);
  s.gather(n1);
  s.linear_backward(LinearSlot::qkv, dC, g.qkv_w, none, dqkv, n1, w.qkv_w);
  rmsnorm_backward(dres, dn1, dC_mine, x, w.norm1_w, n1_rstd);
}

}  // namespace memfit
