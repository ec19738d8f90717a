// AdamW update as torch.optim.AdamW: m, v moments, bias correction, decoupled weight decay;
// in FP32, with FP32 master weights and a bf16 / f16 working copy, or on pure BF16 weights.
// The moments m and v are f32, or both bf16 (--optim-state-dtype bf16, torchtitan-style bf16
// moments): widened on load, updated in f32 exactly as f32 moments are, the weight moved with
// the f32 results, and those rounded to nearest even on store. See Note [bf16 optimizer state]
// (docs/notes/mixed-precision.md).
#pragma once

#include <cstdint>

#include "memfit/memory/tensor.h"

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

// Mixed precision with FP32 master weights: the update above on `master` (f32), and in the
// same pass `working` (bf16 or f16, same element count) = the new master rounded to nearest
// even, the copy the next forward and backward read. master, m and v end bit-identical to
// adamw_update's.
void adamw_update_master(Tensor& master, Tensor& working, const Tensor& grad, Tensor& m, Tensor& v,
                         const AdamWHyper& h, int64_t t, float grad_scale = 1.0f);

// Pure BF16 weights (no master copy): `param` is bf16, grad, m and v f32. The update runs in
// f32 on the widened weight and is stored with stochastic rounding, so that updates smaller
// than half a bf16 ulp (2^-9 to 2^-8 of |p|, larger than most lr * step) still move the weight
// in expectation instead of being rounded away. The random bits of element i come from
// (seed, t, index0 + i): give each parameter tensor its offset in the slab as index0 so that
// no two elements share a stream, whatever the thread count. m and v are bit-identical to
// adamw_update's. Trade-offs: docs/notes/mixed-precision.md.
void adamw_update_stochastic(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                             const AdamWHyper& h, int64_t t, float grad_scale, uint64_t seed,
                             uint64_t index0 = 0);

}  // namespace memfit::kernels
