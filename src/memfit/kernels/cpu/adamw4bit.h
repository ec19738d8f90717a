// AdamW with both moments held in 4 bits ("Memory Efficient Optimizers with 4-bit States", Li,
// Chen, Zhu, NeurIPS 2023): the first moment block-wise (128 values an absmax, the signed
// dynamic-exponent map), the second on the zero-free linear map, block-wise for a 1-D tensor and
// rank-1 normalised for a matrix (element (i, j) scaled by min(row max i, column max j)). Each
// step dequantises, runs the 8-bit AdamW's f32 arithmetic (adam_block_apply) and requantises
// with the new scales. See Note [4-bit optimizer] (docs/notes/4bit-optimizer.md).
#pragma once

#include <cstdint>
#include <functional>
#include <span>

#include "memfit/kernels/cpu/adamw.h"
#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// One step (t from 1) on a flat f32 parameter of n values with its f32 gradient: m_codes and
// v_codes i8 (quant4_bytes(n), two codes a byte), m_absmax and v_absmax f32 (quant4_blocks(n)).
// OpenMP over blocks. grad_scale multiplies g first.
void adamw4bit_update(Tensor& param, const Tensor& grad, Tensor& m_codes, Tensor& m_absmax,
                      Tensor& v_codes, Tensor& v_absmax, const AdamWHyper& h, int64_t t,
                      float grad_scale = 1.0f);

// The same for a (rows, cols) matrix whose second moment has rank-1 scales: v_rowcol f32
// (rows + cols: the row maxima, then the column maxima). Two passes: the new second moment's
// row and column maxima first (nothing stored), then the update, each value requantised with
// the new scales. Scratch of rows + cols floats (and cols per thread) from the heap.
// `reduce_maxima`, where given, is called between the passes with the new row and column maxima
// and may raise them (a tensor-parallel rank's slice of a matrix: the whole matrix's maxima of
// the split dimension, taken over the group; Note [Tensor parallel], "Optimizers"); the second
// pass and v_rowcol take what it leaves.
using RowColMaxima = std::function<void(std::span<float> rows, std::span<float> cols)>;
void adamw4bit_update_rank1(Tensor& param, const Tensor& grad, int64_t rows, int64_t cols,
                            Tensor& m_codes, Tensor& m_absmax, Tensor& v_codes, Tensor& v_rowcol,
                            const AdamWHyper& h, int64_t t, float grad_scale = 1.0f,
                            const RowColMaxima& reduce_maxima = {});

}  // namespace memfit::kernels
