#include "memfit/kernels/cpu/matmul_widened.h"
#include "memfit/kernels/kernel_times.h"

#include <algorithm>

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/dnnl_gemm.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/memory/pool.h"

namespace memfit::kernels {

namespace {

constexpr const char* kOp = "matmul_widened";

// Hands out consecutive f32 regions of the scratch tensor, each aligned like a pool block.
class Carver {
 public:
  explicit Carver(Tensor& scratch) : scratch_(scratch) {
    MEMFIT_CHECK_DTYPE(scratch.dtype() == DType::f32, kOp, "scratch must be f32, got {}",
                       dtype_name(scratch.dtype()));
  }
  // `t` itself if it is f32 or undefined, else an f32 copy of it in the scratch.
  Tensor widened(const Tensor& t, const char* name) {
    if (!t.defined() || t.dtype() == DType::f32) return t;
    check_half(t, name);
    Tensor w = take(t.shape(), name);
    convert(w, t);
    return w;
  }
  // An f32 tensor shaped like `t` to compute into: `t` itself if it is f32 or undefined.
  Tensor output(const Tensor& t, const char* name) {
    if (!t.defined() || t.dtype() == DType::f32) return t;
    check_half(t, name);
    return take(t.shape(), name);
  }

 private:
  // Every half tensor of one call has the same type: a bf16 weight with an f16 input is an error.
  void check_half(const Tensor& t, const char* name) {
    MEMFIT_CHECK_DTYPE(t.dtype() == DType::f16 || t.dtype() == DType::bf16, kOp,
                       "{} must be f32, bf16 or f16, got {}", name, dtype_name(t.dtype()));
    MEMFIT_CHECK_DTYPE(half_ == DType::f32 || half_ == t.dtype(), kOp,
                       "{} is {} but {} is {}: one half type per matmul", name,
                       dtype_name(t.dtype()), half_name_, dtype_name(half_));
    half_ = t.dtype();
    half_name_ = name;
  }
  Tensor take(const Shape& shape, const char* name) {
    const int64_t n = shape.numel();
    const int64_t padded = static_cast<int64_t>(MemoryPool::round_up(n * sizeof(float)) / 4);
    MEMFIT_CHECK_SHAPE(used_ + n <= scratch_.numel(), kOp,
                       "scratch of {} floats is too small for {} {} after {} used", scratch_.numel(),
                       name, shape, used_);
    Tensor t = scratch_.view(used_, shape);
    used_ += padded;
    return t;
  }
  Tensor& scratch_;
  int64_t used_ = 0;
  DType half_ = DType::f32;  // the first half operand's type, and its name
  const char* half_name_ = "";
};

}  // namespace

bool matmul_widens(DType operand) {
  switch (operand) {
    case DType::f16: return true;
    case DType::bf16: return !dnnl_gemm::bf16_native();
    default: return false;
  }
}

size_t matmul_widened_scratch_bytes(int64_t R, int64_t IC, int64_t OC) {
  auto block = [](int64_t n) { return MemoryPool::round_up(static_cast<size_t>(n) * 4); };
  // forward: inp, weight, bias, out; backward: dout, inp, weight, dinp. Bias and out are
  // at most the backward's dout and dinp, so the backward's set bounds both.
  return block(R * OC) + block(R * IC) + block(OC * IC) + block(R * IC) + block(OC);
}

void matmul_forward_widened(Tensor& out, const Tensor& inp, const Tensor& weight,
                            const Tensor& bias, Tensor& scratch) {
  KernelScope timed("matmul_forward_widened");
  Carver c(scratch);
  Tensor x = c.widened(inp, "inp"), w = c.widened(weight, "weight"), b = c.widened(bias, "bias");
  Tensor y = c.output(out, "out");
  matmul_forward(y, x, w, b);
  if (out.dtype() != DType::f32) convert(out, y);
}

// One call is the two halves with nothing between: the products are independent.
void matmul_backward_widened(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                             const Tensor& inp, const Tensor& weight, Tensor& scratch) {
  matmul_backward_widened_around(dinp, dweight, dbias, dout, inp, weight, scratch, [] {});
}

void matmul_backward_widened_around(Tensor& dinp, Tensor& dweight, Tensor& dbias,
                                    const Tensor& dout, const Tensor& inp, const Tensor& weight,
                                    Tensor& scratch, const std::function<void()>& between) {
  // dout, inp, weight and dinp in f32, as matmul_widened_scratch_bytes counts them; inp's region
  // is only a shape until between() has run.
  Carver c(scratch);
  Tensor g = c.widened(dout, "dout"), x = c.output(inp, "inp"), w = c.widened(weight, "weight");
  Tensor dx = c.output(dinp, "dinp"), none;
  {
    KernelScope timed("matmul_backward_widened");
    matmul_backward(dx, none, none, g, x, w);
    if (dinp.defined() && dinp.dtype() != DType::f32) convert(dinp, dx);
  }
  between();
  KernelScope timed("matmul_backward_widened");
  if (inp.dtype() != DType::f32) convert(x, inp);
  matmul_backward(none, dweight, dbias, g, x, w);
}

namespace {

// The checks of the blocked route: f32 out / dinp / dout, one half type for inp and weight.
struct Blocked {
  int64_t R, IC, OC;
};
Blocked check_blocked(const char* op, const Tensor& f32_rows, const Tensor& inp,
                      const Tensor& weight, const Tensor& scratch) {
  MEMFIT_CHECK_SHAPE(inp.shape().rank() == 2 && weight.shape().rank() == 2 &&
                         inp.size(1) == weight.size(1),
                     op, "inp {} and weight {} must be (R, IC) and (OC, IC)", inp.shape(),
                     weight.shape());
  MEMFIT_CHECK_DTYPE(inp.dtype() == weight.dtype() && f32_rows.dtype() == DType::f32 &&
                         scratch.dtype() == DType::f32,
                     op, "inp and weight must share a type ({} and {}); out, dout, scratch f32",
                     dtype_name(inp.dtype()), dtype_name(weight.dtype()));
  const Blocked b{inp.size(0), inp.size(1), weight.size(0)};
  MEMFIT_CHECK_SHAPE(static_cast<size_t>(scratch.numel()) * 4 >=
                         matmul_widened_blocked_scratch_bytes(b.R, b.IC, b.OC),
                     op, "scratch of {} floats is too small for inp {} and weight {}",
                     scratch.numel(), inp.shape(), weight.shape());
  return b;
}

// inp widened at the start of the scratch; the weight block's region after it.
Tensor widen_input(const Tensor& inp, Tensor& scratch) {
  if (inp.dtype() == DType::f32) return inp;
  Tensor x = scratch.view(0, inp.shape());
  convert(x, inp);
  return x;
}
int64_t block_offset(const Blocked& b) {
  return static_cast<int64_t>(MemoryPool::round_up(static_cast<size_t>(b.R * b.IC) * 4) / 4);
}
Tensor widen_rows(const Tensor& weight, int64_t v0, int64_t v1, Tensor& scratch, int64_t off) {
  Tensor part = weight.slice(v0, v1);
  if (weight.dtype() == DType::f32) return part;
  Tensor w = scratch.view(off, part.shape());
  convert(w, part);
  return w;
}

}  // namespace

size_t matmul_widened_blocked_scratch_bytes(int64_t R, int64_t IC, int64_t OC) {
  const int64_t rows = std::min(OC, kWidenedWeightRows);
  return MemoryPool::round_up(static_cast<size_t>(R * IC) * 4) +
         MemoryPool::round_up(static_cast<size_t>(rows * IC) * 4);
}

void matmul_forward_widened_blocked(Tensor& out, const Tensor& inp, const Tensor& weight,
                                    Tensor& scratch) {
  KernelScope timed("matmul_forward_widened_blocked");
  constexpr const char* op = "matmul_forward_widened_blocked";
  const Blocked b = check_blocked(op, out, inp, weight, scratch);
  MEMFIT_CHECK_SHAPE(out.shape() == Shape({b.R, b.OC}), op, "out {} must be ({}, {})",
                     out.shape(), b.R, b.OC);
  const Tensor x = widen_input(inp, scratch);
  for (int64_t v0 = 0; v0 < b.OC; v0 += kWidenedWeightRows) {
    const int64_t v1 = std::min(b.OC, v0 + kWidenedWeightRows);
    const Tensor w = widen_rows(weight, v0, v1, scratch, block_offset(b));
    gemm(false, true, b.R, v1 - v0, b.IC, 1.0f, x.data<float>(), b.IC, w.data<float>(), b.IC,
         0.0f, out.data<float>() + v0, b.OC);
  }
}

void matmul_backward_widened_blocked(Tensor& dinp, Tensor& dweight, const Tensor& dout,
                                     const Tensor& inp, const Tensor& weight, Tensor& scratch) {
  KernelScope timed("matmul_backward_widened_blocked");
  constexpr const char* op = "matmul_backward_widened_blocked";
  const Blocked b = check_blocked(op, dout, inp, weight, scratch);
  MEMFIT_CHECK_SHAPE(dout.shape() == Shape({b.R, b.OC}) && dinp.shape() == inp.shape() &&
                         dinp.dtype() == DType::f32 &&
                         (!dweight.defined() ||
                          (dweight.shape() == weight.shape() && dweight.dtype() == DType::f32)),
                     op, "dout {}, dinp {} and dweight {} must be f32 of ({}, {}), {} and {}",
                     dout.shape(), dinp.shape(), dweight.shape(), b.R, b.OC, inp.shape(),
                     weight.shape());
  const Tensor x = widen_input(inp, scratch);
  const float* g = dout.data<float>();
  for (int64_t v0 = 0; v0 < b.OC; v0 += kWidenedWeightRows) {
    const int64_t v1 = std::min(b.OC, v0 + kWidenedWeightRows), n = v1 - v0;
    const Tensor w = widen_rows(weight, v0, v1, scratch, block_offset(b));
    // dinp (=, then +=) dout[:, v0:v1] @ w; dweight[v0:v1] += dout[:, v0:v1]^T @ x.
    gemm(false, false, b.R, b.IC, n, 1.0f, g + v0, b.OC, w.data<float>(), b.IC,
         v0 == 0 ? 0.0f : 1.0f, dinp.data<float>(), b.IC);
    if (dweight.defined())  // undefined: a frozen weight (LoRA's base)
      gemm(true, false, n, b.IC, b.R, 1.0f, g + v0, b.OC, x.data<float>(), b.IC, 1.0f,
           dweight.data<float>() + v0 * b.IC, b.IC);
  }
}

}  // namespace memfit::kernels
