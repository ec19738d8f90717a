#include "memfit/kernels/cpu/matmul_widened.h"

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
    case DType::bf16: return !dnnl_gemm::bf16_available();
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
  Carver c(scratch);
  Tensor x = c.widened(inp, "inp"), w = c.widened(weight, "weight"), b = c.widened(bias, "bias");
  Tensor y = c.output(out, "out");
  matmul_forward(y, x, w, b);
  if (out.dtype() != DType::f32) convert(out, y);
}

void matmul_backward_widened(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                             const Tensor& inp, const Tensor& weight, Tensor& scratch) {
  Carver c(scratch);
  Tensor g = c.widened(dout, "dout"), x = c.widened(inp, "inp"), w = c.widened(weight, "weight");
  Tensor dx = c.output(dinp, "dinp");
  matmul_backward(dx, dweight, dbias, g, x, w);
  if (dinp.defined() && dinp.dtype() != DType::f32) convert(dinp, dx);
}

}  // namespace memfit::kernels
