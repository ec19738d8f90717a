// Megatron-LM's two halves of a linear layer split across a tensor group, over the plain
// matmul (kernels/cpu/matmul.h; weights (OC, IC) as torch.nn.Linear):
//   column-parallel: each rank holds a slice of the output features (rows of the weight, with
//     their bias); forward is a local GEMM with no collective, backward sums the input's
//     gradient over the group (each rank's GEMM sees only its features' share of it);
//   row-parallel: each rank holds a slice of the input features (columns of the weight); the
//     local GEMM gives a partial output that is summed over the group, then the bias (whole on
//     every rank) is added once; backward is local.
// A column-parallel layer feeding a row-parallel one (attention's qkv then its projection, the
// MLP's fc or gate/up then its down projection) needs one all-reduce each way. Note [Parallel
// linears] in docs/notes/tensor-parallel.md.
#pragma once

#include "memfit/model/tensor_group.h"

namespace memfit {

class Tensor;

// out (R, OC/T) = inp (R, IC) @ weight^T + bias: weight (OC/T, IC) this rank's rows, bias
// (OC/T) or undefined. Local: no collective. The dtypes matmul_forward takes.
void column_parallel_linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                                    const Tensor& bias);

// dinp (=) = the sum over the group of dout (R, OC/T) @ weight (f32: it is all-reduced);
// dweight (+=, this rank's rows) = dout^T @ inp; dbias (+=) the rows' sum of dout. An undefined
// dweight or dbias is skipped; dinp must be defined (the collective is issued on every rank).
void column_parallel_linear_backward(TensorGroup& group, Tensor& dinp, Tensor& dweight,
                                     Tensor& dbias, const Tensor& dout, const Tensor& inp,
                                     const Tensor& weight);

// out (R, OC) f32 = the sum over the group of inp (R, IC/T) @ weight^T, plus bias (OC, the
// same on every rank; or undefined) once: weight (OC, IC/T) holds this rank's columns.
void row_parallel_linear_forward(TensorGroup& group, Tensor& out, const Tensor& inp,
                                 const Tensor& weight, const Tensor& bias);

// The row-parallel forward's second half, for a caller that computed the local partial product
// itself (the block's widened or NF4 GEMMs): out (R, OC) f32 summed over the group in place,
// then bias (OC: f32, bf16 or f16, widened exactly; or undefined) added once on every rank.
// The sum is in f32 in every precision (Note [Parallel linears]).
void row_parallel_linear_reduce(TensorGroup& group, Tensor& out, const Tensor& bias);
// Sequence parallelism (--sp; Note [Sequence parallel]): out (R, OC) f32 the partial product
// the caller computed (as for row_parallel_linear_reduce), whose sum over the group is
// reduce-scattered into this rank's rows (sequence_mine(group, out), R / T of them), the bias
// (f32, bf16 or f16) added to those once. The other rows keep this rank's partial product.
void row_parallel_linear_scatter(TensorGroup& group, Tensor& out, const Tensor& bias);

// dinp (=, this rank's columns; skipped if undefined) = dout (R, OC) @ weight; dweight (+=) =
// dout^T @ inp; dbias (+=) the rows' sum of dout: the whole bias's gradient, the same on every
// rank (a replicated parameter: the ranks must not sum it again). Local: no collective.
void row_parallel_linear_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias,
                                  const Tensor& dout, const Tensor& inp, const Tensor& weight);

}  // namespace memfit
