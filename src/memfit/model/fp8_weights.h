// --precision fp8's stored working weights (issue 44, item 3; Note [FP8], "Storage"): the blocks'
// linear weights as E4M3 codes, one byte a weight, with one power-of-two scale per matrix (a
// fused layer, LLaMA's q|k|v and gate|up, GPT-2's c_attn, is one matrix, as the step multiplies
// it and as the cast it replaces scaled it), in one buffer (Category::params, "params.fp8"):
// every matrix's codes at a 64-byte boundary, then the scales (f32). They are encoded from the
// f32 master weights after every update and load; the step decodes a matrix into the bf16 operand
// scratch where it used to cast the bf16 working copy, which gives the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "memfit/memory/tensor.h"
#include "memfit/model/param_layout.h"

namespace memfit {

// One block linear weight (out, in): its layout elements [layout_offset, + rows x cols) and
// its codes at byte `at` of the buffer; its scale is the buffer's scales()[index].
struct Fp8Matrix {
  int layer = 0;
  LinearSlot slot = LinearSlot::qkv;
  int64_t rows = 0, cols = 0;
  int64_t layout_offset = 0;
  size_t at = 0;
  size_t index = 0;
};

class Fp8WeightLayout {
 public:
  explicit Fp8WeightLayout(const ParamLayout& layout);
  // Layer-major, each layer's in LinearSlot order.
  const std::vector<Fp8Matrix>& matrices() const { return matrices_; }
  // The buffer: the codes, then one f32 scale per matrix from scales_at() (64-byte aligned).
  size_t bytes() const { return scales_at_ + matrices_.size() * sizeof(float); }
  size_t scales_at() const { return scales_at_; }
  int64_t numel() const { return numel_; }  // the weights stored
  // Matrix m's codes in `buffer` (u8, (rows, cols)), and the scales (f32, one per matrix).
  Tensor codes(const Tensor& buffer, const Fp8Matrix& m) const;
  Tensor scales(const Tensor& buffer) const;

 private:
  std::vector<Fp8Matrix> matrices_;
  size_t scales_at_ = 0;
  int64_t numel_ = 0;
};

// The scale a matrix is stored with, from its f32 master weights `master` (Note [FP8],
// "Storage"): fp8_scale_pow2(bf16(amax(master)), e4m3), which is the scale the forward computed
// from the bf16 working copy's amax before the weights were stored.
float fp8_weight_scale(const Tensor& master);

// Encodes matrix m from `master` (f32, its rows x cols values): the scale into the buffer's
// scales, the codes fp8_encode(e4m3, bf16(w) x scale).
void fp8_weight_encode(const Fp8WeightLayout& layout, const Fp8Matrix& m, const Tensor& master,
                       const Tensor& buffer);

// Under --tp each rank holds a slice of every matrix, and a matrix's scale is the whole
// matrix's amax (Note [FP8], "Under --tp and --pp"): replaces each slice's amax in the span by
// the whole matrix's, the same on every rank of the tensor group (fp8_amax_agree, model/
// fp8_shard.h). Empty: one process, or a pipeline stage, where each matrix is whole.
using Fp8AmaxAgree = std::function<void(std::span<float>)>;

// Every matrix whose elements lie in [range.begin, range.end) of `master` (f32, the layout's
// elements from `master_begin`), encoded (a matrix must lie wholly inside or outside the range).
// `agree`: their amaxes (in layout order) made the whole matrices' before the scales are taken.
void fp8_weights_encode(const Fp8WeightLayout& layout, const Tensor& master, int64_t master_begin,
                        ElementRange range, const Tensor& buffer, const Fp8AmaxAgree& agree = {});

}  // namespace memfit
