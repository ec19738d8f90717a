// Adam-mini over equal consecutive blocks: a mean-of-squares pass, then an AdamW-shaped update
// with one step size per block.
// One source for every SIMD target (simd.h); the public function is at the end.
#include "memfit/kernels/cpu/adam_mini.h"
#include "memfit/kernels/kernel_times.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "memfit/kernels/cpu/adam_mini.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "memfit/kernels/cpu/simd-inl.h"

HWY_BEFORE_NAMESPACE();
namespace memfit::kernels::HWY_NAMESPACE {

// Sum of (scale g)^2 in double: each product rounded to float, squared exactly in double.
double AdamMiniSumSquares(const float* g, int64_t n, float scale) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dh;
  const int64_t N = static_cast<int64_t>(hn::Lanes(dd));
  const auto vs = hn::Set(dh, scale);
  auto acc = hn::Zero(dd);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const auto x = hn::PromoteTo(dd, hn::Mul(hn::LoadU(dh, g + i), vs));
    acc = hn::MulAdd(x, x, acc);
  }
  double s = hn::GetLane(hn::SumOfLanes(dd, acc));
  for (; i < n; ++i) {
    const double gi = static_cast<double>(g[i] * scale);
    s += gi * gi;
  }
  return s;
}

// m = beta1 m + (1 - beta1) g; p = p decay - step m, for one block (step already holds
// lr / bc1 / denom). Products and sums rounded separately, as the scalar tail does.
void AdamMiniUpdateBlock(float* p, const float* g, float* m, int64_t n, float beta1, float omb1,
                 float scale, float decay, float step) {
  const DF d;
  const int64_t N = static_cast<int64_t>(hn::Lanes(d));
  const VF b1 = hn::Set(d, beta1), o1 = hn::Set(d, omb1), sc = hn::Set(d, scale);
  const VF dc = hn::Set(d, decay), st = hn::Set(d, step);
  int64_t i = 0;
  for (; i + N <= n; i += N) {
    const VF mi = hn::Add(hn::Mul(b1, hn::LoadU(d, m + i)),
                          hn::Mul(o1, hn::Mul(hn::LoadU(d, g + i), sc)));
    hn::StoreU(mi, d, m + i);
    hn::StoreU(hn::Sub(hn::Mul(hn::LoadU(d, p + i), dc), hn::Mul(st, mi)), d, p + i);
  }
  for (; i < n; ++i) {
    const float mi = beta1 * m[i] + omb1 * (g[i] * scale);
    m[i] = mi;
    p[i] = p[i] * decay - step * mi;
  }
}

}  // namespace memfit::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
#include <cmath>

#include "memfit/kernels/cpu/checks.h"
#include "memfit/kernels/cpu/parallel.h"
#include "memfit/kernels/cpu/simd.h"

namespace memfit::kernels {
HWY_EXPORT(AdamMiniSumSquares);
HWY_EXPORT(AdamMiniUpdateBlock);

namespace {

// The shapes adam_mini_update and adam_mini_update_from_sums take; the number of blocks.
int64_t check_mini(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                   int64_t block_len, int64_t t, const char* op) {
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
  return blocks;
}

// The step of every block, given mean_sq(b) (g^2's mean over block b, in double).
template <class MeanSq>
void mini_blocks(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, int64_t block_len,
                 int64_t blocks, const AdamWHyper& h, int64_t t, float grad_scale,
                 MeanSq&& mean_of) {
  const int64_t n = param.numel();
  const double bc1 = 1.0 - std::pow(static_cast<double>(h.beta1), static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(static_cast<double>(h.beta2), static_cast<double>(t));
  const double sqrt_bc2 = std::sqrt(bc2);
  const float decay = 1.0f - h.lr * h.weight_decay, omb1 = 1.0f - h.beta1;
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* mp = m.data<float>();
  float* vp = v.data<float>();
#pragma omp parallel for schedule(static) if (blocks > 1 && n >= kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t off = b * block_len;
    const double mean_sq = mean_of(b, g + off);
    const float vb = h.beta2 * vp[b] + (1.0f - h.beta2) * static_cast<float>(mean_sq);
    vp[b] = vb;
    const double denom = std::sqrt(static_cast<double>(vb)) / sqrt_bc2 + h.eps;
    const float step = static_cast<float>(h.lr / bc1 / denom);
    MEMFIT_SIMD_DISPATCH(AdamMiniUpdateBlock)(p + off, g + off, mp + off, block_len, h.beta1, omb1,
                                      grad_scale, decay, step);
  }
}

}  // namespace

void adam_mini_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, int64_t block_len,
                      const AdamWHyper& h, int64_t t, float grad_scale) {
  KernelScope timed("adam_mini_update");
  const int64_t blocks = check_mini(param, grad, m, v, block_len, t, "adam_mini");
  mini_blocks(param, grad, m, v, block_len, blocks, h, t, grad_scale,
              [&](int64_t, const float* gb) {
                return MEMFIT_SIMD_DISPATCH(AdamMiniSumSquares)(gb, block_len, grad_scale) /
                       static_cast<double>(block_len);
              });
}

void adam_mini_block_sums(const Tensor& grad, int64_t block_len, float grad_scale,
                          std::span<double> sums) {
  KernelScope timed("adam_mini_block_sums");
  const char* op = "adam_mini_block_sums";
  expect_any_shape(grad, op, "grad", DType::f32);
  const int64_t n = grad.numel();
  MEMFIT_CHECK_SHAPE(block_len >= 1 && n % block_len == 0 &&
                         static_cast<int64_t>(sums.size()) == n / block_len,
                     op, "grad {} of {} values against {} sums of blocks of {}", grad.shape(), n,
                     sums.size(), block_len);
  const float* g = grad.data<float>();
  const int64_t blocks = n / block_len;
#pragma omp parallel for schedule(static) if (blocks > 1 && n >= kParallelGrain)
  for (int64_t b = 0; b < blocks; ++b)
    sums[static_cast<size_t>(b)] =
        MEMFIT_SIMD_DISPATCH(AdamMiniSumSquares)(g + b * block_len, block_len, grad_scale);
}

void adam_mini_update_from_sums(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                                int64_t block_len, std::span<const double> sums, int64_t whole_len,
                                const AdamWHyper& h, int64_t t, float grad_scale) {
  KernelScope timed("adam_mini_update");
  const char* op = "adam_mini_from_sums";
  const int64_t blocks = check_mini(param, grad, m, v, block_len, t, op);
  MEMFIT_CHECK_SHAPE(static_cast<int64_t>(sums.size()) == blocks && whole_len >= block_len, op,
                     "{} sums for {} blocks of {} (whole blocks of {})", sums.size(), blocks,
                     block_len, whole_len);
  mini_blocks(param, grad, m, v, block_len, blocks, h, t, grad_scale,
              [&](int64_t b, const float*) {
                return sums[static_cast<size_t>(b)] / static_cast<double>(whole_len);
              });
}

}  // namespace memfit::kernels
#endif  // HWY_ONCE
