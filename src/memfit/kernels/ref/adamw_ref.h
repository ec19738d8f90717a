// Double-precision reference of one AdamW step (torch.optim.AdamW's formula), for the fast
// kernel's tests and the whole-model reference. An optimizer has no backward.
#pragma once

#include <cstdint>

namespace memfit::kernels::ref {

struct AdamWRefHyper {
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
};

// Step t (from 1) over n elements: g' = grad_scale g; p -= lr wd p; m = b1 m + (1-b1) g';
// v = b2 v + (1-b2) g'^2; p -= lr (m / (1-b1^t)) / (sqrt(v / (1-b2^t)) + eps).
void adamw_update_ref(double* p, const double* g, double* m, double* v, int64_t n,
                      const AdamWRefHyper& h, int64_t t, double grad_scale = 1.0);

// x rounded to the nearest bf16 (8 significant bits; ties to even; bf16's subnormals below
// 2^-126), in double: what storing a moment in bf16 keeps.
double bf16_round_ref(double x);

// The same step with the moments stored in bf16 (--optim-state-dtype bf16): m and v are
// updated as above, the weight moves with those values, then m and v are rounded with
// bf16_round_ref.
void adamw_update_bf16_state_ref(double* p, const double* g, double* m, double* v, int64_t n,
                                 const AdamWRefHyper& h, int64_t t, double grad_scale = 1.0);

}  // namespace memfit::kernels::ref
