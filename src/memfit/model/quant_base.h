// LoRA's quantized frozen base (issue 45, item 2: --base-dtype nf4, QLoRA, or int8): where the
// blocks' four linear weights of a model lie, quantized in one format (kernels/cpu/
// quant_weight.h: NF4, Note [NF4 weights]; int8, Note [Int8 weights]) in one buffer, and their
// quantization from the layout's f32 values, streamed a piece of whole rows at a time, once at
// load. A fused layer (LLaMA's q|k|v and gate|up, GPT-2's c_attn) is one matrix, as the step
// multiplies it. The planner counts bytes(); a model with a quantized base holds the buffer and
// quantizes into it. Note [LoRA], "Quantized base" (docs/notes/lora.md) says what is built.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "memfit/kernels/cpu/quant_weight.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"

namespace memfit {

// One block linear weight (out, in) of the base, quantized.
struct QuantMatrix {
  int layer = 0;
  LinearSlot slot = LinearSlot::qkv;
  int64_t rows = 0, cols = 0;  // out, in
  int64_t layout_offset = 0;   // its first element in the model's ParamLayout
  size_t at = 0;               // its bytes in the buffer (a multiple of 4)
};

class QuantBaseLayout {
 public:
  QuantBaseLayout(const ModelConfig& config, kernels::WeightQuant format);
  kernels::WeightQuant format() const { return format_; }
  // Layer-major, each layer's in LinearSlot order.
  const std::vector<QuantMatrix>& matrices() const { return matrices_; }
  const QuantMatrix& matrix(int layer, LinearSlot slot) const;
  size_t bytes() const { return bytes_; }    // the buffer: the matrices' quant_bytes, in order
  int64_t numel() const { return numel_; }   // the weights it holds
  size_t matrix_bytes(const QuantMatrix& m) const;
  // The f32 scratch the largest matrix's quantization needs (quant_quantize_scratch_bytes:
  // NF4's absmax of every block; 0 for int8).
  size_t quantize_scratch_bytes() const { return scratch_bytes_; }
  // The fewest elements a piece of the streamed quantization may hold: whole rows of the widest
  // matrix, as many as quant_row_step asks.
  int64_t min_piece_elements() const { return min_piece_; }
  // Matrix m's view of `buffer` (at least bytes() bytes, 4-byte aligned).
  kernels::QuantWeight view(const Tensor& buffer, const QuantMatrix& m) const;

 private:
  kernels::WeightQuant format_;
  std::vector<QuantMatrix> matrices_;
  size_t bytes_ = 0, scratch_bytes_ = 0;
  int64_t numel_ = 0, min_piece_ = 0;
};

// Writes the f32 values of layout elements [from, to) into dst (Transformer::RangeFill).
using QuantFill = std::function<void(int64_t from, int64_t to, float* dst)>;

// Quantizes every matrix of `layout` into `buffer` (u8, at least bytes()) from `fill`: a matrix
// a piece of whole rows at a time through `piece` (f32; at least min_piece_elements(), and as
// many rows as fit in multiples of quant_row_step, so a piece starts where the format allows),
// with `scratch` (f32, at least quantize_scratch_bytes(); may be undefined when that is 0), then
// the matrix's last step (NF4's second level). The bytes are the format's quantization of the
// whole matrix, bit for bit.
void quant_base_quantize(const QuantBaseLayout& layout, const Tensor& buffer,
                         const QuantFill& fill, const Tensor& piece, const Tensor& scratch);

}  // namespace memfit
