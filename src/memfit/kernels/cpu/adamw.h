// AdamW update as torch.optim.AdamW: m, v moments, bias correction, decoupled weight decay.
#pragma once

#include <cstdint>

#include "memfit/core/tensor.h"

namespace memfit::kernels {

struct AdamWHyper {
  float lr = 3e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
};

// One step (t counts from 1) on flat f32 tensors of equal element count:
// p -= lr * wd * p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
// p -= lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps).
// grad_scale multiplies g first (1/accum, clip factor).
void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWHyper& h,
                  int64_t t, float grad_scale = 1.0f);

}  // namespace memfit::kernels
