// Plain SGD: one vectorisable, threaded pass over the parameter.
#include "memfit/kernels/cpu/sgd.h"

#include "memfit/kernels/cpu/checks.h"

namespace memfit::kernels {

namespace {
// Tensors below this many values run on the calling thread: a parallel region costs more than
// it saves on them (and much more when the cores are shared).
constexpr int64_t kParallelMinElements = 65536;
}  // namespace

void sgd_update(Tensor& param, const Tensor& grad, float lr, float weight_decay, float grad_scale) {
  expect_any_shape(param, "sgd", "param", DType::f32);
  expect_tensor(grad, "sgd", "grad", param.shape(), DType::f32);
  const int64_t n = param.numel();
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  const float decay = 1.0f - lr * weight_decay, step = lr * grad_scale;
#pragma omp parallel for simd schedule(static) if (n >= kParallelMinElements)
  for (int64_t i = 0; i < n; ++i) p[i] = p[i] * decay - step * g[i];
}

}  // namespace memfit::kernels
