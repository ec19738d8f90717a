#include "memfit/model/block_step.h"

#include <algorithm>
#include <array>

#include "memfit/kernels/cpu/act_quant.h"
#include "memfit/kernels/cpu/attention.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/flash_attention.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/kernels/cpu/quant_matmul.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/model/parallel_linear.h"
#include "memfit/model/sequence_parallel.h"
#include "memfit/model/tensor_group.h"

namespace memfit {

using namespace kernels;

namespace {
// Megatron's halves of the blocks' linears (Note [Parallel linears]): the output projections
// split their input features, the others their output features.
bool row_parallel(LinearSlot slot) {
  return slot == LinearSlot::attn_out || slot == LinearSlot::mlp_out;
}
}  // namespace

std::string block_output_tag(const BlockSlots& slots, int l) {
  if (l < 0) return "encoded";
  const int slot = slots.slot[l];
  return slot < 0 || slots.segment_last[l] ? fmt::format("h.{}.residual_3", l)
                                            : fmt::format("rc.{}.residual_3", slot);
}

BlockStep::BlockStep(StepContext& ctx_, const ModelConfig& config_,
                     const ActivationOptions& options_, int B_, int T_, int layer_,
                     const BlockSlots& slots, const BlockWeights& w_, const BlockWeights& g_)
    : ctx(ctx_), config(config_), options(options_), B(B_), T(T_), layer(layer_), w(w_), g(g_),
      h(half_dtype(options_.precision)) {
  const int slot = slots.slot[layer];
  prefix_ = slot < 0 ? fmt::format("h.{}.", layer) : fmt::format("rc.{}.", slot);
  kept_ = slot < 0;
  sp_ = memfit::sequence_parallel(config, options);
  input_tag_ = block_output_tag(slots, layer - 1);
  output_tag_ = block_output_tag(slots, layer);
}

int64_t BlockStep::stream_rows() const { return sequence_rows(config, options, rows()); }

Shape BlockStep::stream_shape() const {
  return sp_ ? Shape{stream_rows(), config.d_model} : Shape{B, T, config.d_model};
}

Tensor BlockStep::mine(const Tensor& full) const {
  return sp_ ? sequence_mine(ctx.tensor_group(), full) : full;
}

void BlockStep::gather(const Tensor& full) {
  if (sp_) sequence_gather(ctx.tensor_group(), full);
}

Tensor BlockStep::dout_buffer(const Tensor& dres) {
  if (!sp_) return dres;
  // d(output) in the GEMM's dtype: f32, or the half copy of d(residual) in mixed precision
  // (read from the step's options: in the planning pass `dres` holds no data to ask).
  (void)dres;
  return mixed() ? scratch("ws.sp.whole.half", {B, T, config.d_model}, h)
                 : scratch("ws.sp.whole", {B, T, config.d_model}, DType::f32);
}

Tensor BlockStep::gathered_dout(const Tensor& dres, const Tensor& buffer) {
  if (!sp_) return dres;
  sequence_gather_from(ctx.tensor_group(), dres, buffer);
  return buffer;
}

bool BlockStep::compresses() const {
  return kept_ && options.act_compress != ActCompress::none;
}

// Note [Activation compression]: the codes and scales are the block's saved activations; the
// exact values live in one block's worth of workspace, "ws.act.<name>", shared by every block:
// written by the forward, quantised at its end, and written again by the backward's restore.
Tensor BlockStep::save(const char* name, const Shape& shape, DType dtype, Keep keep) {
  if (keep == Keep::exact || !compresses())
    return ctx.write(prefix_ + name, shape, dtype, Category::activations);
  const int64_t n = shape.numel();
  Compressed c;
  c.codes = ctx.write(prefix_ + name + ".codes", {n}, act_codes_dtype(options.act_compress),
                      Category::activations);
  c.scales = ctx.write(prefix_ + name + ".scales", {act_blocks(n)}, DType::f32,
                       Category::activations);
  c.value = ctx.write(std::string("ws.act.") + name, shape, dtype, Category::workspace);
  pending_.push_back(c);
  return c.value;
}

Tensor BlockStep::saved(const char* name, Keep keep) {
  if (keep == Keep::exact || !compresses()) return ctx.read(prefix_ + name);
  const Tensor codes = ctx.read(prefix_ + name + ".codes");
  const Tensor scales = ctx.read(prefix_ + name + ".scales");
  Tensor value = ctx.write_again(std::string("ws.act.") + name);
  if (running()) act_dequantize(codes, scales, value);
  return value;
}

void BlockStep::compress_saved() {
  if (running())
    for (Compressed& c : pending_) act_quantize(c.value, c.codes, c.scales);
  pending_.clear();
}
Tensor BlockStep::input() { return ctx.read(input_tag_); }
Tensor BlockStep::output() {
  return ctx.write(output_tag_, stream_shape(), DType::f32, Category::activations);
}

size_t widen_scratch_bytes(const ModelConfig& c, int64_t N, DType h) {
  if (!matmul_widens(h)) return 0;
  const int64_t C = c.d_model, F = c.local_ffn(), Q = c.qkv_width(), A = c.attn_width();
  const int64_t fc = c.fc_width();
  size_t bytes = 0;
  for (auto [rows, in, out] : {std::array<int64_t, 3>{N, C, Q}, {N, A, C}, {N, C, fc},
                               {N, F, C}})
    bytes = std::max(bytes, matmul_widened_scratch_bytes(rows, in, out));
  return bytes;
}

// The scratch is sized for the largest linear layer of the blocks, so that every block phase's
// matmuls share one buffer; the LM head has its own ("ws.widen.head", transformer_step.cpp).
void declare_matmuls(StepContext& ctx, const ModelConfig& config,
                     const ActivationOptions& options, int64_t rows) {
  if (options.base_quantized) {
    ctx.scratch("ws.quant", quant_scratch_bytes(config, rows, half_dtype(options.precision)));
    return;
  }
  if (const size_t bytes = widen_scratch_bytes(config, rows, half_dtype(options.precision)))
    ctx.scratch("ws.widen", bytes);
}

size_t quant_scratch_bytes(const ModelConfig& c, int64_t N, DType h) {
  const int64_t C = c.d_model, F = c.ffn_dim, Q = c.qkv_width(), A = c.attn_width();
  const int64_t fc = c.fc_width();
  size_t bytes = 0;
  for (auto [rows, in, out] : {std::array<int64_t, 3>{N, C, Q}, {N, A, C}, {N, C, fc},
                               {N, F, C}})
    bytes = std::max(bytes, quant_matmul_scratch_bytes(rows, in, out, h));
  return bytes;
}

void linear_forward(StepContext& ctx, Tensor out, const Tensor& inp, const Tensor& weight,
                    const Tensor& bias) {
  if (matmul_widens(inp.dtype())) {
    Tensor scratch = ctx.view("ws.widen");
    matmul_forward_widened(out, inp, weight, bias, scratch);
  } else {
    matmul_forward(out, inp, weight, bias);
  }
}

void linear_backward(StepContext& ctx, Tensor dinp, Tensor dweight, Tensor dbias, const Tensor& dout,
                     const Tensor& inp, const Tensor& weight) {
  linear_backward_around(ctx, dinp, dweight, dbias, dout, inp, weight, [] {});
}

void linear_backward_around(StepContext& ctx, Tensor dinp, Tensor dweight, Tensor dbias,
                            const Tensor& dout, const Tensor& inp, const Tensor& weight,
                            const std::function<void()>& between) {
  if (matmul_widens(inp.dtype())) {
    Tensor scratch = ctx.view("ws.widen");
    matmul_backward_widened_around(dinp, dweight, dbias, dout, inp, weight, scratch, between);
    return;
  }
  Tensor none;
  matmul_backward(dinp, none, none, dout, inp, weight);
  between();
  matmul_backward(none, dweight, dbias, dout, inp, weight);
}

Fp8Scratch fp8_scratch_elements(const ModelConfig& c, int64_t N) {
  const int64_t C = c.d_model, F = c.ffn_dim, Q = c.qkv_width(), A = c.attn_width();
  const int64_t fc = c.fc_width();
  Fp8Scratch s;
  for (auto [in, out] : {std::array<int64_t, 2>{C, Q}, {A, C}, {C, fc}, {F, C}}) {
    s.x = std::max(s.x, N * in);
    s.w = std::max(s.w, out * in);
    s.dy = std::max(s.dy, N * out);
  }
  return s;
}

void BlockStep::matmuls() {
  declare_matmuls(ctx, config, options, rows());
  if (fp8()) {
    const Fp8Scratch e = fp8_scratch_elements(config, rows());
    fp8_x_ = ctx.scratch("ws.fp8.x", static_cast<size_t>(e.x) * 2);
    fp8_w_ = ctx.scratch("ws.fp8.w", static_cast<size_t>(e.w) * 2);
    fp8_dy_ = ctx.scratch("ws.fp8.dy", static_cast<size_t>(e.dy) * 2);
  }
  if (options.lora_rank > 0) {
    lora_u_ = scratch("ws.lora.u", {rows(), options.lora_rank}, DType::f32);
    lora_du_ = scratch("ws.lora.du", {rows(), options.lora_rank}, DType::f32);
    // bf16 (Note [LoRA], "bf16"): the adapters' f32 GEMMs read the bf16 activations and
    // gradients widened, kLoraChunkRows rows at a time, into two buffers as wide as the widest
    // input or output of a block's linears.
    if (mixed()) {
      const int64_t wide = std::max({int64_t{config.d_model}, config.qkv_width(),
                                     config.attn_width(), config.fc_width(),
                                     int64_t{config.local_ffn()}});
      const int64_t k = std::min(rows(), kLoraChunkRows);
      lora_x_ = scratch("ws.lora.x", {k, wide}, DType::f32);
      lora_y_ = scratch("ws.lora.y", {k, wide}, DType::f32);
    }
    // --lora-dropout (Note [LoRA], "Dropout"): each adapter's dropped copy of a chunk of its
    // layer's input rows.
    if (options.lora_dropout > 0) {
      const int64_t wide_in = std::max({int64_t{config.d_model}, config.attn_width(),
                                        int64_t{config.local_ffn()}});
      const int64_t k = std::min(rows(), kLoraChunkRows);
      lora_xd_ = scratch("ws.lora.xd", {k, wide_in}, DType::f32);
    }
  }
}

namespace {

// Rows [r0, r0 + k) of a (rows, n) matrix as f32 for the adapters' GEMMs: in place when it is
// f32, else widened exactly into `scratch` (row stride n either way).
float* lora_rows(const Tensor& t, int64_t r0, int64_t k, const Tensor& scratch) {
  const int64_t n = t.size(-1);
  if (t.dtype() == DType::f32) return static_cast<float*>(t.raw_data()) + r0 * n;
  float* dst = static_cast<float*>(scratch.raw_data());
  const auto* src = static_cast<const std::byte*>(t.raw_data()) +
                    static_cast<size_t>(r0 * n) * dtype_size(t.dtype());
  convert_n_team(t.dtype(), DType::f32, dst, src, k * n);
  return dst;
}

// After the adapters added into lora_rows(t, ...)'s rows: a half tensor rounded back from the
// scratch (to nearest even, once); f32 was written in place.
void lora_store_rows(const Tensor& t, int64_t r0, int64_t k, const float* rows) {
  if (t.dtype() == DType::f32) return;
  const int64_t n = t.size(-1);
  auto* dst = static_cast<std::byte*>(t.raw_data()) +
              static_cast<size_t>(r0 * n) * dtype_size(t.dtype());
  convert_n_team(DType::f32, t.dtype(), dst, rows, k * n);
}

void check_lora_dtypes(const Tensor& a, const Tensor& b) {
  for (const Tensor* t : {&a, &b})
    MEMFIT_CHECK_DTYPE(t->dtype() == DType::f32 || t->dtype() == DType::bf16, "lora",
                       "LoRA adapters run on f32 or bf16 activations, got {}",
                       dtype_name(t->dtype()));
}

}  // namespace

// Rows of the adapters' GEMMs at a time: all of them in f32 (in place), kLoraChunkRows in bf16
// or with dropout (the dropped copy's rows).
int64_t BlockStep::lora_chunk(const Tensor& t) const {
  return t.dtype() == DType::f32 && options.lora_dropout <= 0 ? rows()
                                                              : std::min(rows(), kLoraChunkRows);
}

// The adapter `part`'s input rows [r0, r0 + k) of x: x itself, or with dropout its dropped copy
// in lora_xd_ (the mask of this layer, slot and part: Note [LoRA], "Dropout").
const float* BlockStep::lora_input(LinearSlot slot, int part, const float* x, int64_t r0,
                                   int64_t k, int64_t in) const {
  if (!lora_dropout.on()) return x;
  float* xd = lora_xd_.data<float>();
  lora_dropout_rows(xd, x, r0, k, in, lora_dropout.p,
                    lora_dropout_key(lora_dropout.draw, layer, slot, part));
  return xd;
}

// The cast's scale is the whole tensor's amax (fp8_cast_dynamic's): under --tp a rank holds a
// slice of some of the tensors (the weights, a row-parallel layer's input, a column-parallel
// layer's d(output)), so the group agrees on the largest of its ranks' amaxes, which is the
// whole tensor's, exactly; for a tensor every rank holds whole the maximum is its own amax
// (Note [FP8], "Under --tp").
Tensor BlockStep::fp8_cast(const Tensor& scratch, const Tensor& t, kernels::Fp8Format f) {
  Tensor q = scratch.view_bytes(0, t.shape(), DType::bf16);
  float amax = kernels::fp8_amax(t);
  if (TensorGroup& group = ctx.tensor_group(); group.size() > 1)
    group.all_reduce_max({&amax, 1});
  kernels::fp8_round_trip(t, kernels::fp8_scale_pow2(amax, f), f, q);
  return q;
}

// Note [FP8] (torchao's tensorwise recipe): d(input) = dy8 W8 and d(W) += dy8^T x8, dy8 the E5M2
// cast of dout, W8 and x8 the E4M3 casts (x8 of the input as it is after `between`, which may
// write it: GPT-2's GELU). The bias gradient sums dout itself, as torchao's bias lies outside
// the FP8 matmul.
// The weight's E4M3 values, exact in bf16, in "ws.fp8.w": the stored codes decoded (code / scale)
// where the weights are stored FP8 (Note [FP8], "Storage"), else the bf16 working weight cast.
// Both give the same bits: the codes are the cast's, encoded from the same values.
Tensor BlockStep::fp8_weight(LinearSlot slot, const Tensor& weight) {
  const Fp8Weight& stored = w.fp8[static_cast<size_t>(slot)];
  if (!stored.codes.defined()) return fp8_cast(fp8_w_, weight, kernels::Fp8Format::e4m3);
  Tensor w8 = fp8_w_.view_bytes(0, stored.codes.shape(), DType::bf16);
  kernels::fp8_dequantize(stored.codes, kernels::Fp8Format::e4m3,
                          1.0f / stored.scale.data<float>()[0], w8);
  return w8;
}

void BlockStep::fp8_linear_backward_around(LinearSlot slot, Tensor dinp, Tensor dweight,
                                           Tensor dbias, const Tensor& dout, const Tensor& inp,
                                           const Tensor& weight,
                                           const std::function<void()>& between,
                                           const std::function<void()>& dinp_done) {
  const Tensor dy8 = fp8_cast(fp8_dy_, dout, kernels::Fp8Format::e5m2);
  const Tensor w8 = fp8_weight(slot, weight);
  const Tensor x8 = fp8_x_.view_bytes(0, inp.shape(), DType::bf16);
  memfit::linear_backward_around(ctx, dinp, dweight, Tensor{}, dy8, x8, w8, [&] {
    between();
    fp8_cast(fp8_x_, inp, kernels::Fp8Format::e4m3);
    dinp_done();
  });
  if (dbias.defined()) memfit::linear_backward(ctx, Tensor{}, Tensor{}, dbias, dout, inp, w8);
}

// Note [FP8]: y = x8 W8^T + b, x8 and W8 the E4M3 casts as exact bf16 values (power-of-two
// scales), the GEMM bf16's (widened where bf16's is). LoRA is refused with fp8 (RunSpec).
//
// Note [LoRA]: the adapters in f32 through the strided GEMM, each on its rows of the output
// (a member of a fused layer is a column range of the output's rows, ldc the layer's width):
// u = x A^T, then y[:, rows] += scale u B^T. In bf16 x and y a chunk of rows at a time widened
// (y rounded back once, after every adapter of the layer added to it).
namespace {

// out (rows, n) += bias (n) on every row, in f32, a half output rounded once (GPT-2's biases
// after a quantized base's product, which has none).
void add_bias_rows(Tensor& out, const Tensor& bias) {
  const int64_t n = out.size(-1), rows = out.numel() / n;
  MEMFIT_CHECK_DTYPE((out.dtype() == DType::f32 || out.dtype() == DType::bf16) &&
                         (bias.dtype() == DType::f32 || bias.dtype() == DType::bf16),
                     "quant_base", "a {} bias added to a {} output", dtype_name(bias.dtype()),
                     dtype_name(out.dtype()));
  const bool f32_bias = bias.dtype() == DType::f32, f32_out = out.dtype() == DType::f32;
  const auto* b = static_cast<const std::byte*>(bias.raw_data());
  auto* o = static_cast<std::byte*>(out.raw_data());
#pragma omp parallel for schedule(static) if (rows * n > kernels::kParallelGrain)
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < n; ++j) {
      const float bj = f32_bias ? reinterpret_cast<const float*>(b)[j]
                                : f32_from_bf16(reinterpret_cast<const uint16_t*>(b)[j]);
      if (f32_out) {
        reinterpret_cast<float*>(o)[r * n + j] += bj;
      } else {
        uint16_t& y = reinterpret_cast<uint16_t*>(o)[r * n + j];
        y = bf16_from_f32(f32_from_bf16(y) + bj);
      }
    }
}

}  // namespace

const kernels::QuantWeight& BlockStep::quant_weight(LinearSlot slot) const {
  const kernels::QuantWeight& q = w.quant[static_cast<size_t>(slot)];
  MEMFIT_CHECK(q.defined(), "quant_base", "layer {} linear {} has no quantized weight", layer,
               static_cast<int>(slot));
  return q;
}

// The base layer's product alone: the tiles (Note [NF4 weights], "Tiles") where the base is
// quantized (NF4 or int8), GPT-2's bias added after, else the dense (possibly widened) GEMM
// with its bias.
void BlockStep::base_forward(LinearSlot slot, Tensor out, const Tensor& inp,
                             const Tensor& weight, const Tensor& bias) {
  if (!options.base_quantized) {
    memfit::linear_forward(ctx, out, inp, weight, bias);
    return;
  }
  if (!running()) return;
  Tensor scratch = ctx.view("ws.quant");
  quant_matmul_forward(out, inp, quant_weight(slot), scratch);
  if (bias.defined()) add_bias_rows(out, bias);
}

// d(input) of the base layer, then `between`, then its weight and bias gradients where defined
// (a quantized base is frozen: it has none).
void BlockStep::base_backward_around(LinearSlot slot, Tensor dinp, Tensor dweight, Tensor dbias,
                                     const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                     const std::function<void()>& between) {
  if (!options.base_quantized) {
    memfit::linear_backward_around(ctx, dinp, dweight, dbias, dout, inp, weight, between);
    return;
  }
  MEMFIT_CHECK(!dweight.defined() && !dbias.defined(), "quant_base",
               "the quantized base is frozen: no weight or bias gradient (layer {})", layer);
  if (running()) {
    Tensor scratch = ctx.view("ws.quant");
    quant_matmul_backward_input(dinp, dout, quant_weight(slot), scratch);
  }
  between();
}

void BlockStep::linear_forward(LinearSlot slot, Tensor out, const Tensor& inp,
                               const Tensor& weight, const Tensor& bias) {
  TensorGroup& group = ctx.tensor_group();
  if (group.size() > 1 && row_parallel(slot)) {
    // The rank's partial product in the run's precision (the widened GEMM where bf16/fp16
    // widen), summed over the group in f32 (reduce-scattered into this rank's rows with --sp),
    // then the bias once (Notes [Parallel linears], [Sequence parallel]); under fp8 the
    // partial product of the casts (fp8_cast: the group's scales). Then the adapter's term
    // (lora_forward_row_parallel; LoRA is refused with fp8).
    if (!fp8()) {
      base_forward(slot, out, inp, weight, Tensor{});
    } else if (running()) {
      const Tensor x8 = fp8_cast(fp8_x_, inp, kernels::Fp8Format::e4m3);
      memfit::linear_forward(ctx, out, x8, fp8_weight(slot, weight), Tensor{});
    }
    if (sp_)
      row_parallel_linear_scatter(group, out, bias);
    else
      row_parallel_linear_reduce(group, out, bias);
    lora_forward_row_parallel(slot, out, inp);
    return;
  }
  if (fp8()) {
    if (!running()) return;
    const Tensor x8 = fp8_cast(fp8_x_, inp, kernels::Fp8Format::e4m3);
    const Tensor w8 = fp8_weight(slot, weight);
    memfit::linear_forward(ctx, out, x8, w8, bias);
    return;
  }
  base_forward(slot, out, inp, weight, bias);
  const LoraSet& adapters = w.lora[static_cast<size_t>(slot)];
  bool adapted = false;
  for (const LoraView& a : adapters) adapted = adapted || a.a.defined();
  if (!running() || !adapted) return;
  check_lora_dtypes(inp, out);
  const int64_t N = rows(), r = options.lora_rank, in = inp.size(-1), width = out.size(-1);
  const int64_t K = std::min(lora_chunk(inp), lora_chunk(out));
  for (int64_t r0 = 0; r0 < N; r0 += K) {
    const int64_t k = std::min(K, N - r0);
    const float* x = lora_rows(inp, r0, k, lora_x_);
    float* y = lora_rows(out, r0, k, lora_y_);
    float* u = lora_u_.data<float>() + r0 * r;
    for (int j = 0; j < kLoraParts; ++j) {
      const LoraView& a = adapters[static_cast<size_t>(j)];
      if (!a.a.defined()) continue;
      const float* xa = lora_input(slot, j, x, r0, k, in);
      gemm(false, true, k, r, in, 1.0f, xa, in, a.a.data<float>(), in, 0.0f, u, r);
      gemm(false, true, k, a.b.size(0), r, a.scale, u, r, a.b.data<float>(), r, 1.0f,
           y + a.row0, width);
    }
    lora_store_rows(out, r0, k, y);
  }
}

// Note [LoRA], "Under --tp": a row-parallel layer's adapter holds A's columns of the rank's
// input features and B whole. u = x_r A_r^T is the rank's share of x A^T: summed over the group
// (rows x r f32, in place in ws.lora.u), then the rank's rows of the output, the group's sum
// with the bias already, get scale u B^T (all rows, or mine(out) under --sp). The backward needs
// no collective: d(input) is the rank's columns of du A, d(A) its columns of du^T x, and d(B)
// from the rank's share of u is its share of the whole, which Transformer::reduce_lora_partials
// sums once a step.
void BlockStep::lora_forward_row_parallel(LinearSlot slot, Tensor out, const Tensor& inp) {
  const LoraView& a = w.lora[static_cast<size_t>(slot)][0];
  if (!running() || !a.a.defined()) return;
  check_lora_dtypes(inp, out);
  const int64_t N = rows(), r = options.lora_rank, in = inp.size(-1);
  float* u = lora_u_.data<float>();
  const int64_t K = lora_chunk(inp);
  for (int64_t r0 = 0; r0 < N; r0 += K) {
    const int64_t k = std::min(K, N - r0);
    const float* x = lora_rows(inp, r0, k, lora_x_);
    gemm(false, true, k, r, in, 1.0f, x, in, a.a.data<float>(), in, 0.0f, u + r0 * r, r);
  }
  TensorGroup& group = ctx.tensor_group();
  group.all_reduce_sum({u, static_cast<size_t>(N * r)});
  const Tensor y_rows = mine(out);
  const int64_t width = out.size(-1), M = y_rows.numel() / width;
  const int64_t m0 = sp_ ? group.rank() * M : 0;
  const int64_t KM = std::min(lora_chunk(y_rows), M);
  for (int64_t r0 = 0; r0 < M; r0 += KM) {
    const int64_t k = std::min(KM, M - r0);
    float* y = lora_rows(y_rows, r0, k, lora_y_);
    gemm(false, true, k, a.b.size(0), r, a.scale, u + (m0 + r0) * r, r, a.b.data<float>(), r,
         1.0f, y, width);
    lora_store_rows(y_rows, r0, k, y);
  }
}

// d(input) gets the adapters' du A (du = scale dout[:, rows] B) before `between` (which may
// rewrite inp, and GPT-2's scales d(input) by the GELU's derivative); then, from inp as it is
// after it, dB += scale dout[:, rows]^T u and dA += du^T x (u = x A^T recomputed: nothing
// saved). The base weight's gradient is skipped where `dweight` is undefined (frozen). In bf16
// the operands a chunk of rows at a time widened, as in the forward; the gradients of A and B
// sum the chunks' products in f32.
void BlockStep::linear_backward_around(LinearSlot slot, Tensor dinp, Tensor dweight, Tensor dbias,
                                       const Tensor& dout, const Tensor& inp,
                                       const Tensor& weight,
                                       const std::function<void()>& between) {
  TensorGroup& group = ctx.tensor_group();
  if (!running() || group.size() == 1 || row_parallel(slot)) {
    linear_backward_local(slot, dinp, dweight, dbias, dout, inp, weight, between, [] {});
    return;
  }
  MEMFIT_CHECK_DTYPE(dinp.dtype() == DType::f32 && dinp.is_contiguous(), "tensor_parallel",
                     "a column-parallel layer's d(input) must be contiguous f32 (it is summed "
                     "over the tensor group), got {} {}", dtype_name(dinp.dtype()),
                     dinp.shape());
  const auto sum = [&group, &dinp, this] {
    if (sp_)  // the rank's rows of the sum (Note [Sequence parallel])
      sequence_scatter_sum(group, dinp);
    else
      group.all_reduce_sum({dinp.data<float>(), static_cast<size_t>(dinp.numel())});
  };
  if (!group.overlaps()) {
    linear_backward_local(slot, dinp, dweight, dbias, dout, inp, weight, between, [] {});
    sum();
    return;
  }
  // --tp-overlap (Note [Tensor parallel], "Overlap"): the sum runs on the group's communication
  // thread from the moment d(input) is whole (after `between`, and under fp8 after the input's
  // cast, a collective of its own) while this thread computes the weight's and bias's (and the
  // adapters') gradients, which neither read nor write d(input) nor call MPI; the same sum of the
  // same values, so the same bits. Joined before anything else communicates, thrown or not.
  bool started = false;
  try {
    linear_backward_local(slot, dinp, dweight, dbias, dout, inp, weight, between, [&] {
      group.start(sum);
      started = true;
    });
  } catch (...) {
    if (started) try {
        group.finish();
      } catch (...) {  // the first error is the one to report
      }
    throw;
  }
  MEMFIT_CHECK(started, "tensor_parallel", "layer {}'s d(input) was never summed", layer);
  group.finish();
}

void BlockStep::linear_backward_local(LinearSlot slot, Tensor dinp, Tensor dweight, Tensor dbias,
                                      const Tensor& dout, const Tensor& inp,
                                      const Tensor& weight,
                                      const std::function<void()>& between,
                                      const std::function<void()>& dinp_done) {
  if (fp8()) {
    if (running())
      fp8_linear_backward_around(slot, dinp, dweight, dbias, dout, inp, weight, between,
                                 dinp_done);
    return;
  }
  const LoraSet& wa = w.lora[static_cast<size_t>(slot)];
  const LoraSet& ga = g.lora[static_cast<size_t>(slot)];
  bool adapted = false;
  for (const LoraView& a : wa) adapted = adapted || a.a.defined();
  if (!running() || !adapted) {
    base_backward_around(slot, dinp, dweight, dbias, dout, inp, weight, [&] {
      between();
      dinp_done();
    });
    return;
  }
  check_lora_dtypes(inp, dout);
  check_lora_dtypes(dinp, dout);
  const int64_t N = rows(), r = options.lora_rank, in = inp.size(-1), width = dout.size(-1);
  const int64_t K = std::min({lora_chunk(inp), lora_chunk(dout), lora_chunk(dinp)});
  // More than one adapter on a layer (q, k, v) needs each one's du after `between`: recomputed
  // there (one (N, out_part) x (out_part, r) GEMM each), so d(input) is done first for all.
  base_backward_around(slot, dinp, Tensor{}, Tensor{}, dout, inp, weight, [&] {
    for (int64_t r0 = 0; r0 < N; r0 += K) {
      const int64_t k = std::min(K, N - r0);
      const float* dy = lora_rows(dout, r0, k, lora_x_);
      float* dx = lora_rows(dinp, r0, k, lora_y_);
      float* du = lora_du_.data<float>() + r0 * r;
      for (int j = 0; j < kLoraParts; ++j) {
        const LoraView& a = wa[static_cast<size_t>(j)];
        if (!a.a.defined()) continue;
        gemm(false, false, k, r, a.b.size(0), a.scale, dy + a.row0, width, a.b.data<float>(), r,
             0.0f, du, r);
        if (!lora_dropout.on()) {
          gemm(false, false, k, in, r, 1.0f, du, r, a.a.data<float>(), in, 1.0f, dx, in);
          continue;
        }
        // Through the dropout: du A into the dropped copy's buffer, masked and scaled into dx.
        float* t = lora_xd_.data<float>();
        gemm(false, false, k, in, r, 1.0f, du, r, a.a.data<float>(), in, 0.0f, t, in);
        lora_dropout_add_rows(dx, t, r0, k, in, lora_dropout.p,
                              lora_dropout_key(lora_dropout.draw, layer, slot, j));
      }
      lora_store_rows(dinp, r0, k, dx);
    }
    between();
    dinp_done();
  });
  if (dweight.defined() || dbias.defined()) {
    Tensor none;
    if (matmul_widens(inp.dtype())) {
      Tensor scratch = ctx.view("ws.widen");
      matmul_backward_widened(none, dweight, dbias, dout, inp, weight, scratch);
    } else {
      matmul_backward(none, dweight, dbias, dout, inp, weight);
    }
  }
  for (int64_t r0 = 0; r0 < N; r0 += K) {
    const int64_t k = std::min(K, N - r0);
    const float* x = lora_rows(inp, r0, k, lora_x_);
    const float* dy = lora_rows(dout, r0, k, lora_y_);
    float* u = lora_u_.data<float>() + r0 * r;
    float* du = lora_du_.data<float>() + r0 * r;
    for (int j = 0; j < kLoraParts; ++j) {
      const LoraView &a = wa[static_cast<size_t>(j)], &da = ga[static_cast<size_t>(j)];
      if (!a.a.defined()) continue;
      const int64_t out = a.b.size(0);
      const float* xa = lora_input(slot, j, x, r0, k, in);  // dA is of the dropped input
      gemm(false, true, k, r, in, 1.0f, xa, in, a.a.data<float>(), in, 0.0f, u, r);
      gemm(true, false, out, r, k, a.scale, dy + a.row0, width, u, r, 1.0f, da.b.data<float>(), r);
      gemm(false, false, k, r, out, a.scale, dy + a.row0, width, a.b.data<float>(), r, 0.0f, du, r);
      gemm(true, false, r, in, k, 1.0f, du, r, xa, in, 1.0f, da.a.data<float>(), in);
    }
  }
}

BlockStep::Attention BlockStep::attention_save() {
  const int64_t C = config.attn_width(), NH = config.local_heads();
  Attention a;
  if (options.attention == AttentionKind::flash) {
    a.lse = save("lse", {B, NH, T}, DType::f32);
    a.ws_fwd = ctx.scratch("ws.attention_fwd",
                           flash_attention_forward_workspace_bytes(B, T, C, heads(), h));
  } else {
    // Selective checkpointing keeps no probabilities per block: one block's worth, recomputed
    // in its backward.
    const Shape shape{B, NH, T, T};
    a.att = options.ckpt.selective()
                ? ctx.write("rc.att", shape, h, Category::activations)
                : save("att", shape, h, Keep::compressible);
    if (mixed())
      a.ws_fwd = ctx.scratch("ws.attention_fwd",
                             attention_forward_workspace_bytes(B, T, C, heads(), h, h, h));
  }
  return a;
}

void BlockStep::attention_forward(Tensor out, Attention& a, const Tensor& qkv) {
  if (options.attention == AttentionKind::flash)
    flash_attention_forward(out, a.lse, qkv, a.ws_fwd, heads());
  else if (!mixed())
    kernels::attention_forward(out, a.att, qkv, heads());
  else
    kernels::attention_forward(out, a.att, qkv, a.ws_fwd, heads());
}

BlockStep::Attention BlockStep::attention_grad_buffers() {
  const int64_t C = config.attn_width(), NH = config.local_heads();
  Attention a;
  if (options.attention == AttentionKind::flash) {
    a.lse = saved("lse");
    a.ws_bwd = ctx.scratch("ws.attention",
                           flash_attention_backward_workspace_bytes(B, T, C, heads(), h));
  } else {
    if (options.ckpt.selective()) {  // this block's probabilities again
      a.att = ctx.write("rc.att", {B, NH, T, T}, h, Category::activations);
      if (mixed())
        a.ws_fwd = ctx.scratch("ws.attention_fwd",
                               attention_forward_workspace_bytes(B, T, C, heads(), h, h, h));
    } else {
      a.att = saved("att", Keep::compressible);
    }
    a.ws_bwd = ctx.scratch("ws.attention",
                           attention_backward_workspace_bytes(B, T, C, heads(), h, h, h, h));
  }
  return a;
}

void BlockStep::attention_backward(Tensor dqkv, const Tensor& dout, const Tensor& qkv,
                                   const Tensor& out, Attention& a, Tensor recompute_out) {
  if (options.attention == AttentionKind::flash) {
    flash_attention_backward(dqkv, dout, qkv, out, a.lse, a.ws_bwd, heads());
    return;
  }
  // The recomputed output equals the saved one; it goes to free scratch instead.
  if (options.ckpt.selective()) attention_forward(recompute_out, a, qkv);
  kernels::attention_backward(dqkv, dout, qkv, a.att, a.ws_bwd, heads());
}

}  // namespace memfit
