// Linear layers whose weight is quantized (LoRA's frozen base: NF4, nf4.h, or int8,
// int8_weight.h; quant_weight.h): out = inp @ W^T and the input gradient dinp = dout @ W, with W
// dequantized a tile at a time into a small caller-provided buffer and each tile multiplied by
// the project's GEMM (dnnl_gemm.h), so no whole f32 or bf16 copy of W ever exists. The weight is
// frozen: there is no weight gradient. The tiles, the routes and the scratch are the same for
// every format. See Note [NF4 weights] (docs/notes/nf4.md), "Tiles", and Note [Int8 weights].
//
// The compute type is the input's (inp for the forward, dout for the backward):
//   f32  -> W dequantized to f32, the f32 GEMM; the output is f32;
//   bf16 -> W dequantized and rounded to bf16 (as bitsandbytes' dequantize to bf16 does), a
//           bf16 GEMM accumulating in f32 (AVX512_BF16 / AMX); the output f32 or bf16, rounded
//           once. Where oneDNN has no native bf16 matmul (matmul_widens(bf16): AVX2 or plain
//           AVX-512, or MEMFIT_MAX_ISA below avx512_bf16) the same numbers go through the f32
//           GEMM: the input widened exactly into the scratch, W's tile the bf16-rounded values
//           as f32 (matmul_widened.h's route).
#pragma once

#include <cstddef>
#include <cstdint>

#include "memfit/kernels/cpu/quant_weight.h"
#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// Forward: rows of W (output features) dequantized per tile; input gradient: columns of W
// (input features), all its rows, per tile. 128 keeps a tile of a 4096-wide weight at 2 MiB in
// f32 (1 MiB in bf16), within a core's L2 share, and the GEMM's N at a size oneDNN's kernels
// block well.
inline constexpr int64_t kQuantTileRows = 128;
inline constexpr int64_t kQuantTileCols = 128;

// Scratch bytes for either product of an (R, IC) input with a (OC, IC) quantized weight (any
// format), computing in
// `compute` (f32 or bf16) on this CPU under the MEMFIT_MAX_ISA cap: the larger of the forward's
// and the backward's. f32 and native bf16: one tile of W (128 x IC, or OC x 128). Widened bf16:
// also the widened input (R x IC f32 forward, R x OC backward) and an f32 output tile (R x 128).
// Each part rounded up as a pool block.
size_t quant_matmul_scratch_bytes(int64_t R, int64_t IC, int64_t OC, DType compute);

// out (N..., OC) = inp (N..., IC) @ W^T, W = (OC, IC) quantized; R = numel(inp) / IC rows. inp f32
// (out f32) or bf16 (out f32 or bf16). scratch: any contiguous tensor of at least
// quant_matmul_scratch_bytes(R, IC, OC, inp.dtype()) bytes. Errors name the format's op
// (nf4_matmul_forward, int8_matmul_forward).
void quant_matmul_forward(Tensor& out, const Tensor& inp, const QuantWeight& w, Tensor& scratch);

// dinp (N..., IC) (=) = dout (N..., OC) @ W. dout f32 (dinp f32) or bf16 (dinp f32 or bf16);
// scratch as above with dout's dtype.
void quant_matmul_backward_input(Tensor& dinp, const Tensor& dout, const QuantWeight& w,
                                 Tensor& scratch);

}  // namespace memfit::kernels
