#include "memfit/train/grad_clip.h"

#include <algorithm>
#include <cmath>

#include "memfit/kernels/cpu/residual.h"

namespace memfit {

double grad_norm(const Tensor& grads) { return std::sqrt(kernels::sum_squares(grads)); }

float clip_factor(double norm, float max_norm) {
  if (max_norm <= 0) return 1.0f;
  return static_cast<float>(std::min(1.0, max_norm / (norm + 1e-6)));
}

}  // namespace memfit
