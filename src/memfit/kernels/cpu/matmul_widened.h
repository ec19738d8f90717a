// Half-precision matmuls through the f32 GEMM, for the operand types oneDNN 2.6 does not multiply
// natively on this CPU: f16 everywhere (it has no f16 matmul on the CPU at all), and bf16 below
// AVX512_BF16 (none under avx512_core: AVX2-only CPUs, or MEMFIT_MAX_ISA=avx2; an emulated one,
// 3x slower than f32, on plain AVX-512: dnnl_gemm::bf16_native). See
// docs/notes/mixed-precision.md, "Matmul: bf16 on AMX, and no f16".
//
// Each half operand is widened exactly into f32 scratch, the f32 kernel runs (accumulating in
// f32, as a half-input GEMM with f32 accumulation would) and a half output is rounded once, to
// nearest even. The numbers are those of a half-input, f32-accumulate GEMM, the speed FP32's;
// the scratch (Category::workspace, sized by matmul_widened_scratch_bytes, planned as the step
// plan's `ws.widen`) is the price of the route. Operands already f32 are used in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// Whether matmuls on `operand` inputs must take this route on this CPU (under the
// MEMFIT_MAX_ISA cap): f16 always, bf16 where oneDNN has no native bf16 matmul, f32 never. The
// model, its step plan and the planner all ask this one question.
bool matmul_widens(DType operand);

// Scratch bytes for any forward or backward of an (R, IC) x (OC, IC)^T product with every
// operand half: the widened input, weight, bias and dout, and an f32 output to round from.
size_t matmul_widened_scratch_bytes(int64_t R, int64_t IC, int64_t OC);

// As matmul_forward: out (f32 or the operands' half type) = inp @ weight^T + bias; inp and
// weight are both bf16 or both f16 (or f32); scratch is f32 of at least
// matmul_widened_scratch_bytes(R, IC, OC) bytes.
void matmul_forward_widened(Tensor& out, const Tensor& inp, const Tensor& weight,
                            const Tensor& bias, Tensor& scratch);

// As matmul_backward: dinp (=, f32 or half, skipped if undefined) = dout @ weight; dweight (f32)
// += dout^T @ inp; dbias (f32, skipped if undefined) += column sums of dout.
void matmul_backward_widened(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                             const Tensor& inp, const Tensor& weight, Tensor& scratch);

// matmul_backward_widened in two halves around `between`: dinp from dout and the weight, then
// between(), which may rewrite inp (the GPT-2 MLP recomputes its GELU, the layer's input, there,
// fused with the GELU's derivative applied to dinp), then dweight and dbias from inp as it is
// then. dout is widened once, into the same scratch; the products are those of one call on the
// final inp.
void matmul_backward_widened_around(Tensor& dinp, Tensor& dweight, Tensor& dbias,
                                    const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                    Tensor& scratch, const std::function<void()>& between);

// The same route for a weight of many rows (the LM head's (Vp, C) vocabulary): the weight is
// widened kWidenedWeightRows rows at a time instead of whole, so the scratch holds the widened
// input and one block of the weight (matmul_widened_blocked_scratch_bytes), not the (Vp, C) f32
// copy and the (R, Vp) f32 gradient of the plain route. Outputs and dout are f32 (the LM head's
// logits and their gradient, widened by the caller); no bias. The products are the same; the
// backward's dinp adds the blocks' partial products in block order.
inline constexpr int64_t kWidenedWeightRows = 2048;
size_t matmul_widened_blocked_scratch_bytes(int64_t R, int64_t IC, int64_t OC);
// out (R, OC) f32 = inp (R, IC) @ weight (OC, IC)^T.
void matmul_forward_widened_blocked(Tensor& out, const Tensor& inp, const Tensor& weight,
                                    Tensor& scratch);
// dinp (R, IC) f32 = dout @ weight; dweight (OC, IC) f32 += dout^T @ inp (skipped where dweight
// is undefined: a frozen weight); dout (R, OC) f32.
void matmul_backward_widened_blocked(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                     const Tensor& inp, const Tensor& weight, Tensor& scratch);

}  // namespace memfit::kernels
