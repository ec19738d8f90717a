// What a family's block code sees while it runs one phase of one block (Note [One step
// description]): the block's layer, its weights and gradients as typed views, its buffers under
// the names the checkpoint policy gives them (its own "h.<l>.*" or a recomputation slot's
// "rc.<s>.*"), and the pieces every family shares: the linear layers (widened where
// kernels::matmul_widens says) and the attention core (flash or plain, selective
// recomputation, grouped-query heads).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "memfit/kernels/cpu/attention_heads.h"
#include "memfit/kernels/cpu/fp8.h"
#include "memfit/model/lora_dropout.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"
#include "memfit/model/step_context.h"

namespace memfit {

// Declares a block phase's matmuls: the widening scratch "ws.widen", sized for the blocks'
// largest matmul, where kernels::matmul_widens(half_dtype(precision)) (nothing otherwise). Then the
// linear layers run through linear_forward / linear_backward, which use it.
void declare_matmuls(StepContext& ctx, const ModelConfig& config,
                     const ActivationOptions& options, int64_t rows);
void linear_forward(StepContext& ctx, Tensor out, const Tensor& inp, const Tensor& weight,
                    const Tensor& bias);
void linear_backward(StepContext& ctx, Tensor dinp, Tensor dweight, Tensor dbias,
                     const Tensor& dout, const Tensor& inp, const Tensor& weight);
// linear_backward in two halves: dinp, then between() (which may rewrite inp), then dweight and
// dbias from inp as it is then. Widened, dout is widened once for both.
void linear_backward_around(StepContext& ctx, Tensor dinp, Tensor dweight, Tensor dbias,
                            const Tensor& dout, const Tensor& inp, const Tensor& weight,
                            const std::function<void()>& between);

// Whether a saved activation may be stored compressed under --act-compress (Note [Activation
// compression]): the matmul, GELU / SwiGLU and attention inputs, the attention output and the
// saved residual may; norm statistics and log-sum-exps stay exact.
enum class Keep : uint8_t { exact, compressible };

// bf16 LoRA: the adapters' GEMMs widen this many rows of their bf16 operands at a time
// (Note [LoRA], "bf16"): 256 x 28672 f32 is 28 MiB at LLaMA-3 8B's widest (gate|up).
inline constexpr int64_t kLoraChunkRows = 256;

class BlockStep {
 public:
  BlockStep(StepContext& ctx, const ModelConfig& config, const ActivationOptions& options, int B,
            int T, int layer, const BlockSlots& slots, const BlockWeights& w,
            const BlockWeights& g);

  StepContext& ctx;
  const ModelConfig& config;
  const ActivationOptions& options;
  const int B, T, layer;
  const BlockWeights& w;  // the working weights (undefined when planning)
  const BlockWeights& g;  // their gradients, accumulated into (+=)
  const DType h;          // matmul operands and saved activations: half_dtype(precision)
  // A training phase's dropout on the adapters' input (Note [LoRA], "Dropout"); off (p = 0)
  // in evaluation, and always without --lora-dropout.
  LoraDropout lora_dropout;

  int64_t rows() const { return int64_t{B} * T; }
  bool running() const { return ctx.running(); }
  bool mixed() const { return h != DType::f32; }
  // This rank's heads (all of them without --tp).
  kernels::AttentionHeads heads() const {
    return {config.local_heads(), config.local_kv_heads()};
  }

  // Sequence parallelism (--sp; Note [Sequence parallel], model/sequence_parallel.h): the
  // residual stream (the block's input and output, residual_2, ws.dresidual) and the norms'
  // statistics hold stream_rows() = rows() / tp of the tokens, shaped stream_shape(); the norm
  // outputs, the linears and attention see all rows(). Without it stream_rows() is rows() and
  // the helpers below change nothing.
  bool sequence_parallel() const { return sp_; }
  int64_t stream_rows() const;
  Shape stream_shape() const;
  // Running: the rows of a whole (B, T, C) buffer this rank holds (the buffer itself without
  // --sp). gather(): every rank's rows of `full`, written in place, gathered (nothing without
  // --sp).
  Tensor mine(const Tensor& full) const;
  void gather(const Tensor& full);
  // The row-parallel linears' d(output): declared with the block's buffers, "ws.sp.whole" (B, T,
  // C) f32 under --sp, else `dres` itself; running, gathered_dout() fills it from this rank's
  // rows `dres` and returns it.
  Tensor dout_buffer(const Tensor& dres);
  Tensor gathered_dout(const Tensor& dres, const Tensor& buffer);

  // This block's saved activations (Category::activations): written in its forward (and
  // recomputation), read in its backward. A compressible one, in a block that keeps its
  // activations, under --act-compress int8 / fp8, is two buffers, "<name>.codes" (one byte a
  // value) and "<name>.scales" (f32, one per 64 values): save() then hands out the exact values
  // in the workspace scratch "ws.act.<name>", which compress_saved() quantises once the forward's
  // kernels have run, and saved() declares the same scratch again and, running, restores the
  // values into it before returning it. The block code reads and writes the returned tensor
  // either way.
  Tensor save(const char* name, const Shape& shape, DType dtype, Keep keep = Keep::exact);
  Tensor saved(const char* name, Keep keep = Keep::exact);
  // Whether this block's compressible activations are stored compressed: --act-compress is not
  // none and the block keeps its activations (one that is recomputed never compresses).
  bool compresses() const;
  // After a training forward's kernels (TransformerStep calls it): quantises what save()
  // handed out for compression. Nothing when planning.
  void compress_saved();
  Tensor input();   // the block's input: the embedding or the previous block's output
  Tensor output();  // the block's output, (B, T, C) f32, written
  // Scratch shared by every block (Category::workspace): "ws.<name>".
  Tensor scratch(const std::string& tag, const Shape& shape, DType dtype) {
    return ctx.write(tag, shape, dtype, Category::workspace);
  }
  Tensor scratch_read(const std::string& tag) { return ctx.read(tag); }

  // Declares the phase's matmuls (the widening scratch, where there is one); then the linears.
  // With --precision fp8 also the FP8 operands' bf16 scratch (fp8_scratch_shapes): the linears
  // then cast their weight and input to E4M3 and their output gradient to E5M2 into it, each
  // with its own current scale, and multiply those (Note [FP8], docs/notes/fp8.md).
  // With LoRA also the adapters' (rows, rank) f32 scratch, "ws.lora.u" and "ws.lora.du", and
  // in bf16 their widened operands, "ws.lora.x" and "ws.lora.y" (kLoraChunkRows, the blocks'
  // widest linear) f32 each; with --lora-dropout "ws.lora.xd", kLoraChunkRows rows of the
  // dropped input (the blocks' widest linear input) f32.
  void matmuls();
  // `slot` names the layer, whose LoRA adapters (w.lora, g.lora: none without --lora-rank) the
  // linears add to the output and to d(input), and whose gradients they accumulate (Note [LoRA]).
  // Under tensor parallelism (ctx.tensor_group() of more than one rank; Note [Tensor parallel])
  // the slot also says the layer's half: qkv and fc are column-parallel (their d(input), f32, is
  // summed over the group after the backward's GEMMs), attn_out and mlp_out row-parallel (their
  // output, f32, is summed over the group before the bias is added, once, on every rank). Under
  // --sp both sums are reduce-scatters: the rank's rows, mine(out) or mine(dinp), hold them
  // (and the row-parallel bias), the other rows stay partial. With --tp-overlap
  // (TensorGroup::overlaps) the column-parallel sum runs while the weight's gradient computes.
  void linear_forward(LinearSlot slot, Tensor out, const Tensor& inp, const Tensor& weight,
                      const Tensor& bias);
  void linear_backward(LinearSlot slot, Tensor dinp, Tensor dweight, Tensor dbias,
                       const Tensor& dout, const Tensor& inp, const Tensor& weight) {
    linear_backward_around(slot, dinp, dweight, dbias, dout, inp, weight, [] {});
  }
  void linear_backward_around(LinearSlot slot, Tensor dinp, Tensor dweight, Tensor dbias,
                              const Tensor& dout, const Tensor& inp, const Tensor& weight,
                              const std::function<void()>& between);

  // The attention core. Forward: declare with attention_save() (what the backward needs besides
  // qkv and out: flash's log-sum-exps or plain's probabilities), then attention_forward().
  // Backward: declare with attention_grad_buffers(), then attention_backward(), which first
  // recomputes plain attention's probabilities under selective checkpointing (into
  // `recompute_out`, any free (B, T, q*hs) scratch of type h).
  struct Attention {
    Tensor lse, att, ws_fwd, ws_bwd;
  };
  Attention attention_save();
  void attention_forward(Tensor out, Attention& a, const Tensor& qkv);
  Attention attention_grad_buffers();
  void attention_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv, const Tensor& out,
                          Attention& a, Tensor recompute_out);

 private:
  struct Compressed {
    Tensor value, codes, scales;
  };
  std::string prefix_, input_tag_, output_tag_;
  bool sp_ = false;                  // --sp (sequence_parallel(config, options))
  bool kept_ = true;                 // this block keeps its activations (not recomputed)
  std::vector<Compressed> pending_;  // saved in this forward, to quantise
  Tensor lora_u_, lora_du_;          // x A^T and d(x A^T) of one adapter (with LoRA)
  Tensor lora_x_, lora_y_;           // bf16 LoRA: a chunk of rows of its operands, widened
  Tensor lora_xd_;                   // LoRA dropout: a chunk of rows of the dropped input
  Tensor fp8_x_, fp8_w_, fp8_dy_;    // --precision fp8: the cast input, weight, output gradient
  bool fp8() const { return options.precision == Precision::fp8; }
  // A bf16 view of `scratch`'s first bytes shaped like t, holding t cast to FP8 format f with
  // the tensor group's scale (the whole tensor's amax).
  Tensor fp8_cast(const Tensor& scratch, const Tensor& t, kernels::Fp8Format f);
  // The slot's weight as E4M3 values in bf16 (fp8_w_): the stored codes decoded, or `weight`
  // cast (Note [FP8], "Storage").
  Tensor fp8_weight(LinearSlot slot, const Tensor& weight);
  void fp8_linear_backward_around(LinearSlot slot, Tensor dinp, Tensor dweight, Tensor dbias,
                                  const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                  const std::function<void()>& between,
                                  const std::function<void()>& dinp_done);
  int64_t lora_chunk(const Tensor& t) const;
  // Under --tp, after a row-parallel layer's sum: its adapter's term (Note [LoRA], "Under --tp").
  void lora_forward_row_parallel(LinearSlot slot, Tensor out, const Tensor& inp);
  // The base layer alone: dense, or a quantized base's tiles ("ws.quant") with GPT-2's bias
  // after.
  void base_forward(LinearSlot slot, Tensor out, const Tensor& inp, const Tensor& weight,
                    const Tensor& bias);
  void base_backward_around(LinearSlot slot, Tensor dinp, Tensor dweight, Tensor dbias,
                            const Tensor& dout, const Tensor& inp, const Tensor& weight,
                            const std::function<void()>& between);
  const kernels::QuantWeight& quant_weight(LinearSlot slot) const;
  // The layer's gradients on this rank: d(input), between(), dinp_done() once d(input) is whole
  // (nothing after it reads or writes d(input) or communicates: --tp-overlap starts its sum
  // there), then the weight's, bias's and adapters' gradients.
  void linear_backward_local(LinearSlot slot, Tensor dinp, Tensor dweight, Tensor dbias,
                             const Tensor& dout, const Tensor& inp, const Tensor& weight,
                             const std::function<void()>& between,
                             const std::function<void()>& dinp_done);
  const float* lora_input(LinearSlot slot, int part, const float* x, int64_t r0, int64_t k,
                          int64_t in) const;
};

// The tag of block l's output under these slots: "h.<l>.residual_3" where it is kept (a block
// that keeps its buffers, or the last of a recomputed segment), else its slot's. "encoded" for
// l == -1 (the embedding's).
std::string block_output_tag(const BlockSlots& slots, int l);

// --precision fp8's operand scratch, elements of bf16 each (Note [FP8]): "ws.fp8.x" the largest
// linear input (rows x in), "ws.fp8.w" the largest weight (out x in), "ws.fp8.dy" the largest
// output gradient (rows x out). Declared by every block phase's matmuls().
struct Fp8Scratch {
  int64_t x = 0, w = 0, dy = 0;
};
Fp8Scratch fp8_scratch_elements(const ModelConfig& config, int64_t rows);

// The widening scratch the blocks' matmuls need, in bytes: the largest of the family's linear
// layers (0 where nothing widens). The LM head widens its weight a block at a time in a
// scratch of its own (matmul_widened.h, matmul_forward_widened_blocked).
size_t widen_scratch_bytes(const ModelConfig& config, int64_t rows, DType h);
// A quantized base (ActivationOptions::base_quantized): the tiled products' scratch,
// "ws.quant", in bytes: the largest quant_matmul_scratch_bytes of the blocks' linear layers,
// computing in h (the same for NF4 and int8).
size_t quant_scratch_bytes(const ModelConfig& config, int64_t rows, DType h);

}  // namespace memfit
