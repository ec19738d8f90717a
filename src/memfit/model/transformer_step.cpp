#include "memfit/model/transformer_step.h"

#include "memfit/model/family_compute.h"

#include <algorithm>

#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/crossentropy.h"
#include "memfit/kernels/cpu/embedding.h"
#include "memfit/kernels/cpu/fill.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/kernels/cpu/rope.h"
#include "memfit/model/vocab_parallel_crossentropy.h"
#include "memfit/model/vocab_parallel_embedding.h"

namespace memfit {

using namespace kernels;

namespace {

// The stage a step runs: the whole model for one stage; else checked against the model and
// the checkpoint policy (a recomputed segment may not cross a stage's edge: each stage
// recomputes from inputs it holds). A tied model's last stage reads its LM head from its copy of
// the token table (ParamLayout; Note [Pipeline parallel], "Tied embeddings").
// A stage's model (ModelConfig::stage: its parameters alone) runs its stage; the options may
// name the same stage or none. The whole model may run any stage the options name (the
// other stages' parameters idle: tests/dist/pipeline_model_test.cpp).
PipelineStage stage_of(const ModelConfig& config, const ActivationOptions& options) {
  MEMFIT_CHECK(!config.pipelined() || options.stage.stages <= 1 || options.stage == config.stage,
               "pipeline", "a plan of stage {} of {} for the model of stage {} of {}",
               options.stage.index, options.stage.stages, config.stage.index,
               config.stage.stages);
  const PipelineStage& s = config.pipelined() ? config.stage : options.stage;
  if (s.stages <= 1) return {0, 1, 0, config.n_layer};
  MEMFIT_CHECK(s.index >= 0 && s.index < s.stages && s.first >= 0 && s.first < s.last &&
                   s.last <= config.n_layer && (s.index == 0) == (s.first == 0) &&
                   (s.index + 1 == s.stages) == (s.last == config.n_layer),
               "pipeline", "stage {} of {} with blocks [{}, {}) does not cut a model of {} blocks",
               s.index, s.stages, s.first, s.last, config.n_layer);
  MEMFIT_CHECK(!options.grads_in_arena && !options.inference, "pipeline",
               "a stage's plan without gradients in the arena or inference");
  for (const auto& [a, b] : options.ckpt.segments(config.n_layer))
    MEMFIT_CHECK((a < s.first) == (b < s.first) && (a < s.last) == (b < s.last), "pipeline",
                 "--ckpt {} recomputes blocks {}-{} together, across stage {}'s blocks [{}, {})",
                 options.ckpt.name(), a, b, s.index, s.first, s.last);
  return s;
}

}  // namespace

TransformerStep::TransformerStep(const ModelConfig& config, const ActivationOptions& options,
                                 int B, int T)
    : config_(config), options_(options), B_(B), T_(T), family_(model_family(config.family)),
      compute_(family_compute(config.family)),
      slots_(block_slots(options.ckpt, config.n_layer)), stage_(stage_of(config, options)) {
  check_activation_options(options);
  check_sequence_parallel(config, options, T);
  if (family_.rotary)
    rope_inv_freq_ = rope_inv_freq(config.head_size(), config.rope_theta, config.rope_scaling);
}

// This rank's first vocabulary row (0 in one process): vocab_shard's over the tensor group,
// which must be the config's --tp.
int64_t TransformerStep::vocab_begin(const StepContext& ctx) const {
  const TensorGroup& group = ctx.tensor_group();
  MEMFIT_CHECK(group.size() == config_.tp, "model",
               "a tensor group of {} ranks for a model split over --tp {}", group.size(),
               config_.tp);
  return vocab_shard(config_.vocab_size, group.size(), group.rank(), kVocabPadMultiple).begin;
}

Shape TransformerStep::stream_shape() const {
  const int64_t C = config_.d_model;
  return sp() ? Shape{sequence_rows(config_, options_, int64_t{B_} * T_), C} : Shape{B_, T_, C};
}

void TransformerStep::block_forward(StepContext& ctx, PhaseKind kind, int l,
                                    const ModelWeights& w, const ModelWeights& g,
                                    bool training) {
  ctx.enter(kind, l);
  // A forward alone (a pipeline stage's forward before it sends, evaluation) may be given no
  // gradient views: a forward reads none, and g.blocks[l] of an empty list is undefined.
  static const BlockWeights kNoGrads{};
  const BlockWeights& gl = static_cast<size_t>(l) < g.blocks.size() ? g.blocks[l] : kNoGrads;
  BlockStep s(ctx, config_, options_, B_, T_, l, slots_, w.blocks[l], gl);
  if (training) s.lora_dropout = lora_dropout();  // evaluation runs without (Note [LoRA])
  compute_.block_forward(s);
  // --act-compress: what this block keeps, once its kernels have run (Note [Activation
  // compression]).
  if (training) s.compress_saved();
}

void TransformerStep::forward_blocks(StepContext& ctx, const ModelWeights& w,
                                     const ModelWeights& g, const Tensor* tokens,
                                     bool training) {
  const int64_t C = config_.d_model, N = int64_t{B_} * T_;
  const DType h = half_dtype(options_.precision), f32 = DType::f32;
  ctx.enter(PhaseKind::embedding);
  // A later stage's first block reads the previous stage's output as its input.
  const bool embeds = stage_.has_embeddings();
  Tensor encoded = ctx.write(embeds ? "encoded" : block_output_tag(slots_, stage_.first - 1),
                             stream_shape(), f32, Category::activations);
  // --sp: the whole lookup, each rank's share of every row, before the reduce-scatter.
  Tensor whole = sp() && embeds ? ctx.write("ws.sp.whole", {B_, T_, C}, f32, Category::workspace)
                                : Tensor{};
  // Rotary positions (LLaMA): the table of this micro-batch's positions, read by every block.
  Tensor rope;
  if (family_.rotary)
    rope = ctx.write("rope", {T_, config_.head_size()}, f32, Category::activations);
  // The tokens, kept for the embedding's backward; a whole step declares them in the LM head's
  // phase (lm_head), a first stage without the head here.
  if (embeds && !stage_.has_head())
    ctx.write("tokens", {B_, T_}, DType::i32, Category::activations);
  if (ctx.running() && !embeds) {
    MEMFIT_CHECK(io_.input, "pipeline", "stage {}'s forward without its input", stage_.index);
    std::copy_n(io_.input, encoded.numel(), encoded.data<float>());
    if (family_.rotary) rope_table(rope, rope_inv_freq_);
  } else if (ctx.running()) {
    // The tables have padded rows, so the embedding alone would accept ids up to padded_vocab.
    const int32_t* ids = tokens->data<int32_t>();
    for (int64_t i = 0; i < tokens->numel(); ++i)
      MEMFIT_CHECK(ids[i] >= 0 && ids[i] < config_.vocab_size, "model",
                   "token {} at position {} is outside the vocabulary [0, {})", ids[i], i,
                   config_.vocab_size);
    if (ctx.tensor_group().size() > 1)  // --tp: this rank's rows of the table (Note [Tensor parallel])
      vocab_parallel_embedding_forward(ctx.tensor_group(), encoded, *tokens, w.tok_emb,
                                       vocab_begin(ctx), w.pos_emb, sp() ? &whole : nullptr);
    else
      embedding_forward(encoded, *tokens, w.tok_emb, w.pos_emb);  // pos_emb: GPT-2 only
    if (family_.rotary) rope_table(rope, rope_inv_freq_);
  }
  for (int l = stage_.first; l < stage_.last; ++l)
    block_forward(ctx, PhaseKind::forward, l, w, g, training);

  ctx.enter(PhaseKind::final_norm);
  if (!stage_.has_head()) {  // the stage's output, for the next stage
    Tensor y = ctx.read(block_output_tag(slots_, stage_.last - 1));
    // (A forward rerun before its backward sends nothing: no output.)
    if (ctx.running() && io_.output) std::copy_n(y.data<float>(), y.numel(), io_.output);
    return;
  }
  const std::string tag = final_norm_tag();
  Tensor x = ctx.read(block_output_tag(slots_, config_.n_layer - 1));
  Tensor out = ctx.write(tag, {B_, T_, C}, h, Category::activations);
  // --sp: the norm of this rank's rows into their place in the whole output, then gathered for
  // the LM head, which reads every row (Note [Sequence parallel]).
  const bool split = sp() && ctx.running();
  compute_.final_norm_forward(ctx, config_, tag, sequence_rows(config_, options_, N), x,
                              split ? sequence_mine(ctx.tensor_group(), out) : out, w);
  if (split) sequence_gather(ctx.tensor_group(), out);
}

// Note [Fused LM head]: the logits of a GPT-2 batch are (B*T, V) floats, 412 MB for 8 x 256
// tokens, and their gradient as much again. Instead, rows are taken `lm_head_chunk` at a time:
// logits = norm @ head^T for the chunk, softmax cross-entropy, and (in training) the chunk's
// gradient at once: d(norm) rows = dlogits @ head, d(head) += dlogits^T @ norm. Only one chunk
// of logits ever exists, and the LM head costs no extra matmul.
// In bf16/fp16 the chunk's gradient is rounded into ws.dlogits, the head's matmul operand, while
// the logits, softmax and loss stay f32 (see crossentropy.h); where the matmuls widen, it is
// rounded in place in the f32 logits instead. On oneDNN's bf16 GEMM ws.dlogits holds a group of
// chunks (lm_head_grad_rows) and d(head) is accumulated once per group.
void TransformerStep::lm_head(StepContext& ctx, const ModelWeights& w, const ModelWeights& g,
                              const Tensor* targets, const Tensor* mask, bool training,
                              float dloss, float* loss_sum) {
  // Vp: this rank's rows of the head (all of them without --tp).
  const int64_t N = int64_t{B_} * T_, C = config_.d_model, Vp = config_.local_vocab();
  const int64_t R = lm_head_rows(options_, N);       // the chunk
  const int64_t G = lm_head_grad_rows(options_, N);  // the gradient's group of chunks
  const int64_t D = lm_head_dx_rows(options_, N);    // grouped: d(norm)'s rows per GEMM
  const DType h = half_dtype(options_.precision), f32 = DType::f32;
  const bool mixed = h != f32;
  ctx.enter(PhaseKind::lm_head);
  Tensor norm = ctx.read(final_norm_tag());
  Tensor logits_ws = ctx.write("ws.logits", {R, Vp}, f32, Category::workspace);
  Tensor losses = ctx.write("ws.losses", {N}, f32, Category::workspace);
  Tensor dnorm = ctx.write("ws.dC", {B_, T_, C}, f32, Category::workspace);
  // Where the matmuls widen (fp16; bf16 without oneDNN bf16), the head has its own scratch: the
  // chunk's widened rows and one block of the widened weight (matmul_widened.h), not ws.widen;
  // and the chunk's gradient, rounded to h, is kept widened in the logits themselves.
  const bool widens = matmul_widens(h);
  Tensor dlogits_ws = mixed && !widens
                          ? ctx.write("ws.dlogits", {G, Vp}, h, Category::workspace)
                          : logits_ws;
  Tensor head_ws = widens ? ctx.scratch("ws.widen.head",
                                        matmul_widened_blocked_scratch_bytes(R, C, Vp))
                          : Tensor{};
  // The tokens, kept for the embedding's backward (written by forward()).
  ctx.write("tokens", {B_, T_}, DType::i32, Category::activations);
  if (!ctx.running()) return;

  norm = norm.reshape({N, C});
  dnorm = dnorm.reshape({N, C});
  Tensor flat_targets = targets->reshape({N});
  Tensor flat_mask = mask ? mask->reshape({N}) : Tensor{};
  Tensor dhead = g.head, no_grad;
  // --tp (Note [Vocabulary-parallel cross-entropy]): the logits are this rank's slice of the
  // vocabulary; the loss takes the row max and the sum of exponentials over the group, and
  // d(norm), each rank's share of dlogits @ head, is summed over it once the chunks are done.
  TensorGroup& group = ctx.tensor_group();
  const bool split = group.size() > 1;
  const int64_t v0 = split ? vocab_begin(ctx) : 0, V = config_.vocab_size;
  for (int64_t g0 = 0; g0 < N; g0 += G) {
    const int64_t g1 = std::min(N, g0 + G);
    int64_t dx0 = g0;  // grouped: the first row whose d(norm) is still to compute
    for (int64_t r0 = g0; r0 < g1; r0 += R) {
      const int64_t r1 = std::min(g1, r0 + R), rows = r1 - r0;
      Tensor x = norm.slice(r0, r1);
      Tensor logits = logits_ws.slice(0, rows);
      Tensor tgt = flat_targets.slice(r0, r1), loss = losses.slice(r0, r1);
      Tensor chunk_mask = mask ? flat_mask.slice(r0, r1) : Tensor{};
      const Tensor* keep = mask ? &chunk_mask : nullptr;
      if (widens)
        matmul_forward_widened_blocked(logits, x, w.head, head_ws);
      else
        linear_forward(ctx, logits, x, w.head, no_grad);
      if (!training) {
        if (split)
          vocab_parallel_crossentropy_forward(group, loss, logits, tgt, v0, V, keep);
        else
          crossentropy_forward(loss, logits, tgt, config_.vocab_size, keep);
        continue;
      }
      Tensor dlogits = dlogits_ws.slice(r0 - g0, r1 - g0);
      if (split) {  // the gradient rounded to h in place in the logits (Note [Tensor parallel])
        vocab_parallel_crossentropy_forward_backward(group, loss, logits, tgt, v0, V, dloss, h,
                                                     keep);
        if (mixed && !widens) convert(dlogits, logits);  // the half GEMM's operand: exact
      } else if (mixed && !widens)
        crossentropy_forward_backward(loss, dlogits, logits, tgt, config_.vocab_size, dloss,
                                      keep);
      else  // f32, or the gradient rounded to h and kept widened in place
        crossentropy_forward_backward(loss, logits, tgt, config_.vocab_size, dloss, h, keep);
      Tensor dx = dnorm.slice(r0, r1);
      if (widens) {
        matmul_backward_widened_blocked(dx, dhead, logits, x, w.head, head_ws);
      } else if (G == R) {
        linear_backward(ctx, dx, dhead, no_grad, dlogits, x, w.head);
      } else if (r1 - dx0 >= D || r1 == g1) {
        // d(norm) at least D rows at a time, d(head) once the group is complete.
        Tensor dl = dlogits_ws.slice(dx0 - g0, r1 - g0), dxs = dnorm.slice(dx0, r1);
        matmul_backward(dxs, no_grad, no_grad, dl, norm.slice(dx0, r1), w.head);
        dx0 = r1;
      }
    }
    if (training && !widens && G != R) {
      Tensor dlogits = dlogits_ws.slice(0, g1 - g0), x = norm.slice(g0, g1);
      matmul_backward(no_grad, dhead, no_grad, dlogits, x, w.head);
    }
  }
  if (training && split && sp())  // --sp: this rank's rows of the sum, for its final norm
    sequence_scatter_sum(group, dnorm);
  else if (training && split)
    group.all_reduce_sum({dnorm.data<float>(), static_cast<size_t>(dnorm.numel())});
  double sum = 0;
  const float* l = losses.data<float>();
  for (int64_t i = 0; i < N; ++i) sum += l[i];
  *loss_sum = static_cast<float>(sum);
}

float TransformerStep::forward(StepContext& ctx, const ModelWeights& w, const ModelWeights& g,
                               const Tensor* tokens, const Tensor* targets, bool training,
                               float dloss, const Tensor* mask) {
  forward_blocks(ctx, w, g, tokens, training);
  float loss_sum = 0;
  if (stage_.has_head()) lm_head(ctx, w, g, targets, mask, training, dloss, &loss_sum);
  if (ctx.running() && training && stage_.has_embeddings()) {
    // backward() needs the tokens for the embedding's gradient; keep a copy in the plan's
    // buffer rather than trusting the caller's tensor to stay unchanged.
    Tensor saved = ctx.view("tokens");
    std::copy_n(tokens->data<int32_t>(), tokens->numel(), saved.data<int32_t>());
  }
  return loss_sum;
}

void TransformerStep::backward(StepContext& ctx, const ModelWeights& w, const ModelWeights& g,
                               const std::function<void(int)>& done) {
  auto report = [&](int part) {
    if (done && ctx.running()) done(part);
  };
  const int64_t C = config_.d_model;
  {
    // ws.dC holds d(norm) from the fused LM head; ws.dresidual becomes d(top block's output)
    // (a stage before the last: the next stage's gradient of its output).
    ctx.enter(PhaseKind::final_norm_backward);
    Tensor dres = ctx.write("ws.dresidual", stream_shape(), DType::f32, Category::workspace);
    if (stage_.has_head()) {
      const std::string tag = final_norm_tag();
      Tensor dnorm = ctx.read("ws.dC");  // --sp: this rank's rows hold the sum
      if (sp() && ctx.running()) dnorm = sequence_mine(ctx.tensor_group(), dnorm);
      Tensor x = ctx.read(block_output_tag(slots_, config_.n_layer - 1));
      compute_.final_norm_backward(ctx, tag, dres, dnorm, x, w, g);
    } else if (ctx.running()) {
      MEMFIT_CHECK(io_.dout, "pipeline", "stage {}'s backward without its output's gradient",
                   stage_.index);
      std::copy_n(io_.dout, dres.numel(), dres.data<float>());
    }
  }
  if (stage_.has_head()) report(config_.n_layer);
  // Checkpointing: entering a recomputed segment from its last block, rerun its forward from
  // the kept input of its first block. (A stage's segments lie inside it: stage_of.)
  int segment = static_cast<int>(slots_.segments.size()) - 1;
  while (segment >= 0 && slots_.segments[segment].first >= stage_.last) --segment;
  for (int l = stage_.last - 1; l >= stage_.first; --l) {
    if (segment >= 0 && slots_.segments[segment].second == l) {
      const auto [first, last] = slots_.segments[segment--];
      for (int k = first; k <= last; ++k) block_forward(ctx, PhaseKind::recompute, k, w, g);
    }
    ctx.enter(PhaseKind::backward, l);
    BlockStep s(ctx, config_, options_, B_, T_, l, slots_, w.blocks[l], g.blocks[l]);
    s.lora_dropout = lora_dropout();
    compute_.block_backward(s);
    report(l);
  }
  ctx.enter(PhaseKind::embedding_backward);
  Tensor dres = ctx.read("ws.dresidual");
  if (!stage_.has_embeddings()) {  // the gradient of this stage's input, for the previous one
    if (ctx.running()) {
      MEMFIT_CHECK(io_.din, "pipeline", "stage {}'s backward without a place for its input's "
                   "gradient", stage_.index);
      std::copy_n(dres.data<float>(), dres.numel(), io_.din);
    }
    report(-1);  // the stage's backward is over (per-unit gradients finish their exchanges)
    ctx.finish();
    return;
  }
  Tensor tokens = ctx.read("tokens");
  // --sp: d(encoded) of every row, gathered, so each rank's slice of the table and the whole
  // position table get their whole gradients (no sum over the group).
  Tensor whole = sp() ? ctx.write("ws.sp.whole", {B_, T_, C}, DType::f32, Category::workspace)
                      : dres;
  if (ctx.running() && g.tok_emb.defined()) {  // undefined: a frozen base (Note [LoRA])
    Tensor dwte = g.tok_emb, dwpe = g.pos_emb;
    if (sp()) sequence_gather_from(ctx.tensor_group(), dres, whole);
    if (ctx.tensor_group().size() > 1)
      vocab_parallel_embedding_backward(dwte, dwpe, whole, tokens, vocab_begin(ctx));
    else
      embedding_backward(dwte, dwpe, dres, tokens);
  }
  report(-1);
  ctx.finish();
}

void TransformerStep::logits(StepContext& ctx, const ModelWeights& w, const Tensor& tokens,
                             Tensor& out) {
  const int64_t N = int64_t{B_} * T_, C = config_.d_model, V = config_.vocab_size,
                Vp = config_.padded_vocab;
  MEMFIT_CHECK(ctx.tensor_group().size() == 1, "model",
               "whole logits under --tp are not built (each rank holds a slice of the vocabulary)");
  forward_blocks(ctx, w, w, &tokens, /*training=*/false);
  ctx.enter(PhaseKind::lm_head);
  Tensor norm = ctx.view(final_norm_tag()).reshape({N, C}), logits_ws = ctx.view("ws.logits");
  Tensor no_bias;
  const int64_t R = logits_ws.size(0);
  float* dst = out.data<float>();
  for (int64_t r0 = 0; r0 < N; r0 += R) {
    const int64_t r1 = std::min(N, r0 + R);
    Tensor block = logits_ws.slice(0, r1 - r0);
    Tensor x = norm.slice(r0, r1);
    if (matmul_widens(x.dtype())) {
      Tensor head_ws = ctx.view("ws.widen.head");
      matmul_forward_widened_blocked(block, x, w.head, head_ws);
    } else {
      linear_forward(ctx, block, x, w.head, no_bias);
    }
    const float* src = block.data<float>();
    for (int64_t r = 0; r < r1 - r0; ++r) std::copy_n(src + r * Vp, V, dst + (r0 + r) * V);
  }
}

}  // namespace memfit
