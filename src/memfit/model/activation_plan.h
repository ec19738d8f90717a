// The buffers one micro-batch needs besides parameters and gradients: what forward saves for
// backward (Category::activations) and the scratch that backward and the chunked LM head reuse
// from layer to layer (Category::workspace), as the step's code declares them (step_context.h),
// and the options that shape them. step_plan.h gives each its lifetime and its offset in its
// category's arena; the model allocates that plan and the planner evaluates it, so prediction
// and reality share one source of truth.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "memfit/core/dtype.h"
#include "memfit/core/shape.h"
#include "memfit/memory/arena.h"
#include "memfit/memory/category.h"
#include "memfit/model/checkpoint_policy.h"
#include "memfit/model/pipeline_stages.h"
#include "memfit/model/precision.h"

namespace memfit {

struct BufferSpec {
  std::string tag;  // "h.3.qkv", "ws.logits"
  Shape shape;
  DType dtype;
  Category category;
  // Set by plan_step (step_plan.h): the phases in which it is live, and where it lies in
  // its category's arena.
  Lifetime lifetime;
  size_t offset = 0;
  // The offset was given, not assigned: a gradient unit's, at its place in the parameter
  // layout's slab (Note [Gradients by lifetime]).
  bool pinned = false;
  size_t bytes() const;  // its room in the arena: rounded up to the pool's alignment
};

enum class AttentionKind : uint8_t {
  flash,  // tiled, saves one log-sum-exp per query row (Note [Flash attention])
  plain,  // saves the (T, T) probabilities of every head
};
AttentionKind attention_kind_from_name(std::string_view name);  // ConfigError if unknown
std::string_view attention_kind_name(AttentionKind kind);

// How the blocks that keep their activations store the compressible ones (the matmul, GELU /
// SwiGLU and attention inputs, the attention output, the saved residual; Note [Activation
// compression] in docs/notes/activation-compression.md): as they are, or as 8-bit codes with one
// f32 scale per 64 values (kernels/cpu/act_quant.h), restored just before the backward reads
// them. What is recomputed is never compressed.
enum class ActCompress : uint8_t {
  none,
  int8,  // absmax int8 (codes i8)
  fp8,   // FP8 E4M3 with a per-block scale (codes u8)
};
ActCompress act_compress_from_name(std::string_view name);  // ConfigError if unknown
std::string_view act_compress_name(ActCompress c);
DType act_codes_dtype(ActCompress c);  // i8 or u8 (not for none)

struct ActivationOptions {
  // Rows of logits computed at a time (Note [Fused LM head]); 0: plan_step chooses (the
  // default, doubled while that costs no arena byte) and records the choice here in the plan's
  // options.
  int lm_head_chunk = 0;
  // Rows of the LM head's gradient gathered for one d(head) GEMM on oneDNN's bf16 GEMM
  // (lm_head_grad_rows; --lm-head-group); 0: kLmHeadGradRows. More rows cost ws.dlogits bytes
  // (2 Vp a row) and save the head's GEMMs re-reading their weight and f32 gradient: on a
  // 16-core AMX Xeon, 2048 rows made a gpt2 8 x 256 bf16 step about 5% shorter (the median of
  // nine rounds) for 147 MiB; on a 2-core Zen 5 they changed nothing (Note [Fused LM head], "A
  // larger group").
  int lm_head_group = 0;
  AttentionKind attention = AttentionKind::flash;
  // Set by the model from its own precision: matmul operands and saved activations are in
  // half_dtype(precision) (docs/notes/mixed-precision.md has the table).
  Precision precision = Precision::fp32;
  CheckpointPolicy ckpt;  // which blocks are recomputed in backward (checkpoint_policy.h)
  ActCompress act_compress = ActCompress::none;  // how kept blocks store their activations
  // The f32 gradient slab lives in the activations arena (Note [Gradients by lifetime] in
  // docs/notes/planner.md): each unit's gradients (the embeddings, each block, the tail) from
  // the phase that first writes them to the step's end, sharing bytes with the activations
  // that died before; zeroed as they are born, not by zero_grad. For a step whose gradients
  // the update reads right after its one micro-batch (RunSpec::grads_share_arena).
  bool grads_in_arena = false;
  // A step that is a forward alone (`memfit sample`; Note [Inference plan] in
  // docs/notes/planner.md): the plan records the evaluation forward and no backward, so what a
  // block saves for a backward dies with the next block and the arenas hold about two blocks'
  // buffers; Transformer::reserve allocates no gradient slab, and a training forward or a
  // backward under it is an error.
  bool inference = false;
  // LoRA's rank (model/lora.h; 0: none): every block phase's matmuls then declare the
  // adapters' f32 scratch, "ws.lora.u" and "ws.lora.du", (rows, rank) each (Note [LoRA]).
  int lora_rank = 0;
  // LoRA's dropout on the adapters' input (model/lora_dropout.h; 0: none): the matmuls then
  // also declare "ws.lora.xd", a chunk of the dropped input (Note [LoRA], "Dropout").
  float lora_dropout = 0;
  // Pipeline parallelism (model/pipeline_stages.h; Note [Pipeline parallel]): the stage whose
  // part of the step this plan runs, blocks [first, last), the embeddings only on the first
  // stage and the final norm and LM head only on the last. One stage (the default): the whole
  // step, as without pipelining.
  PipelineStage stage;
  // A quantized base (--base-dtype nf4 or int8; Note [NF4 weights], "QLoRA"): the blocks'
  // linear weights are NF4 or int8; every block phase's matmuls then declare "ws.quant", the
  // tiled products' scratch (quant_matmul_scratch_bytes of the largest linear, the same for
  // either format), and no "ws.widen" (a frozen base has no weight gradient to widen for).
  bool base_quantized = false;
  // Sequence parallelism (--sp, under --tp above 1; model/sequence_parallel.h, Note [Sequence
  // parallel]): the residual stream, the norms and their statistics hold this rank's 1/tp of
  // the tokens; the gathers before the column-parallel linears land in the whole buffers they
  // read (workspace), and the backward gathers d(output) into "ws.sp.dout". No effect at tp 1.
  bool sequence_parallel = false;

  bool operator==(const ActivationOptions&) const = default;
};

// The LM head's default chunk: 128 rows of f32 logits at a time in every route (Note [Fused LM
// head]: the chunk's logits are the step's largest workspace buffer; at 128 rows they are no
// larger than a block's backward scratch at gpt2 4 x 256). plan_step takes twice it where that
// costs no arena byte.
int64_t default_lm_head_chunk(const ActivationOptions& options);
// The LM head's chunk for `rows` rows of tokens: options.lm_head_chunk where set (plan_step
// always sets it), else the default. At most `rows`.
int64_t lm_head_rows(const ActivationOptions& options, int64_t rows);
// Rows of the LM head's gradient per weight-gradient GEMM: on oneDNN's bf16 GEMM the chunks'
// bf16 logit gradients gather in ws.dlogits until there are options.lm_head_group of them
// (kLmHeadGradRows where 0; the d(head) GEMM's K: its f32 (Vp, C) result is read and written
// once per group, not once per chunk); at the default chunk that takes the bytes the old
// 256-row chunk's f32 logits and bf16 gradient took. One chunk elsewhere (fp32 computes the
// gradient in place in the logits; the widened route widens it into them). At most `rows`.
inline constexpr int64_t kLmHeadGradRows = 512;
int64_t lm_head_grad_rows(const ActivationOptions& options, int64_t rows);
// Grouped, the rows of d(norm) = dlogits @ head per GEMM: half the group, at least a chunk (each
// GEMM reads the whole head weight, so more rows read it fewer times). At the default group,
// 256: a gpt2 8 x 256 step's d(norm) took 197 ms at 256 rows a GEMM, 221 at 128 and 219 at 512
// (2-core AMD EPYC, AVX512_BF16). Where the gradient is not grouped, a chunk.
int64_t lm_head_dx_rows(const ActivationOptions& options, int64_t rows);

// ConfigError for options no plan exists for: flash attention in fp16 (flash has no f16 path).
void check_activation_options(const ActivationOptions& options);

// Where each block's buffers live under a checkpoint policy: slot[l] is -1 for a block that
// keeps its own ("h.l.*"), else its position in its recomputed segment, whose buffers are the
// shared "rc.<slot>.*" (except the segment's output, "h.<last>.residual_3", which is kept).
struct BlockSlots {
  std::vector<int> slot;
  std::vector<bool> segment_last;
  std::vector<std::pair<int, int>> segments;
  int slots = 0;  // length of the longest segment
};
BlockSlots block_slots(const CheckpointPolicy& ckpt, int n_layer);

// Sum of the plan's buffer bytes in one category (what the buffers would take unshared).
size_t plan_bytes(const std::vector<BufferSpec>& plan, Category category);

}  // namespace memfit
