// QLoRA's frozen base (issue 45, item 2): where the blocks' four linear weights of a model lie
// as NF4 (kernels/cpu/nf4.h, Note [NF4 weights]) in one buffer, and their quantization from the
// layout's f32 values, streamed a piece of whole rows at a time, once at load. A fused layer
// (LLaMA's q|k|v and gate|up, GPT-2's c_attn) is one matrix, as the step multiplies it. The
// planner counts bytes(); a model with an NF4 base holds the buffer and quantizes into it.
// Note [LoRA], "NF4 base" (docs/notes/lora.md) says what is built and what is not.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "memfit/kernels/cpu/nf4.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/model_config.h"
#include "memfit/model/param_layout.h"

namespace memfit {

// One block linear weight (out, in) of the base, as NF4.
struct Nf4Matrix {
  int layer = 0;
  LinearSlot slot = LinearSlot::qkv;
  int64_t rows = 0, cols = 0;  // out, in
  int64_t layout_offset = 0;   // its first element in the model's ParamLayout
  size_t at = 0;               // its bytes in the NF4 buffer (a multiple of 4)
};

class Nf4BaseLayout {
 public:
  explicit Nf4BaseLayout(const ModelConfig& config);
  // Layer-major, each layer's in LinearSlot order.
  const std::vector<Nf4Matrix>& matrices() const { return matrices_; }
  const Nf4Matrix& matrix(int layer, LinearSlot slot) const;
  size_t bytes() const { return bytes_; }    // the buffer: the matrices' nf4_bytes, in order
  int64_t numel() const { return numel_; }   // the weights it holds
  // The f32 absmax scratch the largest matrix's quantization needs (nf4_quantize_scratch_bytes).
  size_t quantize_scratch_bytes() const { return scratch_bytes_; }
  // Matrix m's view of `buffer` (at least bytes() bytes, 4-byte aligned).
  kernels::Nf4Weight view(const Tensor& buffer, const Nf4Matrix& m) const;

 private:
  std::vector<Nf4Matrix> matrices_;
  size_t bytes_ = 0, scratch_bytes_ = 0;
  int64_t numel_ = 0;
};

// Writes the f32 values of layout elements [from, to) into dst (Transformer::RangeFill).
using Nf4Fill = std::function<void(int64_t from, int64_t to, float* dst)>;

// Quantizes every matrix of `layout` into `buffer` (u8, at least bytes()) from `fill`: a matrix
// a piece of whole rows at a time through `piece` (f32; at least one row, and as many rows as
// fit whose count times cols is a multiple of 64, so a piece starts a block), each block's
// absmax into `absmax` (f32, at least quantize_scratch_bytes()), then the matrix's second level.
// The bytes are kernels::nf4_quantize's of the whole matrix, bit for bit.
void nf4_base_quantize(const Nf4BaseLayout& layout, const Tensor& buffer, const Nf4Fill& fill,
                       const Tensor& piece, const Tensor& absmax);

}  // namespace memfit
