#include "memfit/kernels/cpu/matmul_f16.h"

#include "memfit/core/error.h"
#include "memfit/kernels/cpu/convert.h"
#include "memfit/kernels/cpu/matmul.h"
#include "memfit/memory/pool.h"

namespace memfit::kernels {

namespace {

constexpr const char* kOp = "matmul_f16";

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
    MEMFIT_CHECK_DTYPE(t.dtype() == DType::f16, kOp, "{} must be f32 or f16, got {}", name,
                       dtype_name(t.dtype()));
    Tensor w = take(t.shape(), name);
    convert(w, t);
    return w;
  }
  // An f32 tensor shaped like `t` to compute into: `t` itself if it is f32 or undefined.
  Tensor output(const Tensor& t, const char* name) {
    if (!t.defined() || t.dtype() == DType::f32) return t;
    MEMFIT_CHECK_DTYPE(t.dtype() == DType::f16, kOp, "{} must be f32 or f16, got {}", name,
                       dtype_name(t.dtype()));
    return take(t.shape(), name);
  }

 private:
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
};

}  // namespace

size_t matmul_f16_scratch_bytes(int64_t R, int64_t IC, int64_t OC) {
  auto block = [](int64_t n) { return MemoryPool::round_up(static_cast<size_t>(n) * 4); };
  // forward: inp, weight, bias, out; backward: dout, inp, weight, dinp. Bias and out are
  // at most the backward's dout and dinp, so the backward's set bounds both.
  return block(R * OC) + block(R * IC) + block(OC * IC) + block(R * IC) + block(OC);
}

void matmul_forward_f16(Tensor& out, const Tensor& inp, const Tensor& weight, const Tensor& bias,
                        Tensor& scratch) {
  Carver c(scratch);
  Tensor x = c.widened(inp, "inp"), w = c.widened(weight, "weight"), b = c.widened(bias, "bias");
  Tensor y = c.output(out, "out");
  matmul_forward(y, x, w, b);
  if (out.dtype() == DType::f16) convert(out, y);
}

void matmul_backward_f16(Tensor& dinp, Tensor& dweight, Tensor& dbias, const Tensor& dout,
                         const Tensor& inp, const Tensor& weight, Tensor& scratch) {
  Carver c(scratch);
  Tensor g = c.widened(dout, "dout"), x = c.widened(inp, "inp"), w = c.widened(weight, "weight");
  Tensor dx = c.output(dinp, "dinp");
  matmul_backward(dx, dweight, dbias, g, x, w);
  if (dinp.defined() && dinp.dtype() == DType::f16) convert(dinp, dx);
}

}  // namespace memfit::kernels
