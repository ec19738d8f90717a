// Adam-mini over equal consecutive blocks: a mean-of-squares pass, then an AdamW-shaped update
// with one step size per block.
#include "memfit/kernels/cpu/adam_mini.h"

#include <cmath>

#include "memfit/kernels/cpu/checks.h"

namespace memfit::kernels {

namespace {

// Tensors below this many values run on the calling thread: a parallel region costs more than
// it saves on them (and much more when the cores are shared).
constexpr int64_t kParallelMinElements = 65536;

// Sum of (scale g)^2 in double; `omp simd` lets the compiler vectorise the reduction.
double sum_squares(const float* g, int64_t n, float scale) {
  double s = 0.0;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < n; ++i) {
    double gi = static_cast<double>(g[i] * scale);
    s += gi * gi;
  }
  return s;
}

// m = beta1 m + (1 - beta1) g; p = p decay - step m, for one block (step already holds
// lr / bc1 / denom). Plain loops that vectorise without any division or square root.
void update_block(float* p, const float* g, float* m, int64_t n, float beta1, float omb1,
                  float scale, float decay, float step) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float mi = beta1 * m[i] + omb1 * (g[i] * scale);
    m[i] = mi;
    p[i] = p[i] * decay - step * mi;
  }
}

}  // namespace

void adam_mini_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, int64_t block_len,
                      const AdamWHyper& h, int64_t t, float grad_scale) {
  const char* op = "adam_mini";
  expect_any_shape(param, op, "param", DType::f32);
  expect_tensor(grad, op, "grad", param.shape(), DType::f32);
  const int64_t n = param.numel();
  MEMFIT_CHECK_SHAPE(block_len >= 1 && n % block_len == 0, op,
                     "param {} of {} values does not split into blocks of {}", param.shape(), n,
                     block_len);
  const int64_t blocks = n / block_len;
  expect_tensor(m, op, "m", param.shape(), DType::f32);
  expect_tensor(v, op, "v", {blocks}, DType::f32);
  MEMFIT_CHECK(t >= 1, op, "step count t must start at 1, got {}", t);

  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(t));
  const double sqrt_bc2 = std::sqrt(bc2);
  const float decay = 1.0f - h.lr * h.weight_decay, omb1 = 1.0f - h.beta1;
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* mp = m.data<float>();
  float* vp = v.data<float>();
#pragma omp parallel for schedule(static) if (blocks > 1 && n >= kParallelMinElements)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t off = b * block_len;
    const double mean_sq =
        sum_squares(g + off, block_len, grad_scale) / static_cast<double>(block_len);
    const float vb = h.beta2 * vp[b] + (1.0f - h.beta2) * static_cast<float>(mean_sq);
    vp[b] = vb;
    const double denom = std::sqrt(static_cast<double>(vb)) / sqrt_bc2 + h.eps;
    const float step = static_cast<float>(h.lr / bc1 / denom);
    update_block(p + off, g + off, mp + off, block_len, h.beta1, omb1, grad_scale, decay, step);
  }
}

}  // namespace memfit::kernels
