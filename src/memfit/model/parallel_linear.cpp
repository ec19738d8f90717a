// Column- and row-parallel linears: the plain matmul on this rank's slice, with the group's sum
// where a rank's GEMM sees only part of a result (Megatron-LM's f and g operators).
#include "memfit/model/parallel_linear.h"

#include <span>

#include "memfit/core/dtype.h"
#include "memfit/core/error.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/memory/tensor.h"
#include "memfit/model/sequence_parallel.h"

namespace memfit {
namespace {

// The f32 elements of a defined, contiguous tensor, for a collective.
std::span<float> floats_of(const Tensor& t, std::string_view op, std::string_view name) {
  MEMFIT_CHECK(t.defined(), op, "{} is undefined", name);
  MEMFIT_CHECK(t.is_contiguous(), op, "{} {} is not contiguous", name, t.shape());
  MEMFIT_CHECK_DTYPE(t.dtype() == DType::f32, op, "{} must be f32 (it is summed over the group), "
                     "got {} {}", name, dtype_name(t.dtype()), t.shape());
  return {t.data<float>(), static_cast<size_t>(t.numel())};
}

// out (R, OC) f32 += bias (OC: f32, bf16 or f16, widened exactly; or undefined: nothing) on
// every row.
void add_bias(std::string_view op, const Tensor& out, const Tensor& bias) {
  if (!bias.defined()) return;
  const int64_t OC = out.size(out.rank() - 1), R = out.numel() / OC;
  MEMFIT_CHECK_SHAPE(bias.rank() == 1 && bias.size(0) == OC && bias.is_contiguous(), op,
                     "bias {} for out {}", bias.shape(), out.shape());
  const DType bt = bias.dtype();
  MEMFIT_CHECK_DTYPE(bt == DType::f32 || bt == DType::bf16 || bt == DType::f16, op,
                     "bias must be f32, bf16 or f16, got {}", dtype_name(bt));
  const void* braw = bias.raw_data();
  auto b = [&](int64_t j) {
    const auto* h = static_cast<const uint16_t*>(braw);
    return bt == DType::f32    ? static_cast<const float*>(braw)[j]
           : bt == DType::bf16 ? f32_from_bf16(h[j])
                               : f32_from_f16(h[j]);
  };
  float* y = floats_of(out, op, "out").data();
#pragma omp parallel for schedule(static) if (R * OC > (1 << 16))
  for (int64_t r = 0; r < R; ++r)
    for (int64_t j = 0; j < OC; ++j) y[r * OC + j] += b(j);
}

}  // namespace

void column_parallel_linear_forward(Tensor& out, const Tensor& inp, const Tensor& weight,
                                    const Tensor& bias) {
  kernels::matmul_forward(out, inp, weight, bias);
}

void column_parallel_linear_backward(TensorGroup& group, Tensor& dinp, Tensor& dweight,
                                     Tensor& dbias, const Tensor& dout, const Tensor& inp,
                                     const Tensor& weight) {
  const std::span<float> d = floats_of(dinp, "column_parallel_linear_backward", "dinp");
  kernels::matmul_backward(dinp, dweight, dbias, dout, inp, weight);
  group.all_reduce_sum(d);
}

void row_parallel_linear_forward(TensorGroup& group, Tensor& out, const Tensor& inp,
                                 const Tensor& weight, const Tensor& bias) {
  floats_of(out, "row_parallel_linear_forward", "out");
  kernels::matmul_forward(out, inp, weight, Tensor{});
  row_parallel_linear_reduce(group, out, bias);
}

void row_parallel_linear_reduce(TensorGroup& group, Tensor& out, const Tensor& bias) {
  constexpr std::string_view op = "row_parallel_linear_reduce";
  group.all_reduce_sum(floats_of(out, op, "out"));
  add_bias(op, out, bias);
}

void row_parallel_linear_scatter(TensorGroup& group, Tensor& out, const Tensor& bias) {
  constexpr std::string_view op = "row_parallel_linear_scatter";
  floats_of(out, op, "out");
  sequence_scatter_sum(group, out);
  add_bias(op, sequence_mine(group, out), bias);
}

void row_parallel_linear_backward(Tensor& dinp, Tensor& dweight, Tensor& dbias,
                                  const Tensor& dout, const Tensor& inp, const Tensor& weight) {
  kernels::matmul_backward(dinp, dweight, dbias, dout, inp, weight);
}

}  // namespace memfit
