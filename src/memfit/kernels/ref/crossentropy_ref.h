// Double-precision reference of softmax cross-entropy over padded vocabulary rows, checked by
// finite differences.
#pragma once

#include <cstdint>

namespace memfit::kernels::ref {

// logits (R, Vp) with the first V columns real; targets (R) in [0, V);
// losses[r] = -log softmax(logits[r, :V])[targets[r]], times mask[r] (0 or 1) when a mask is
// given.
void crossentropy_forward_ref(double* losses, const double* logits, const int32_t* targets,
                              int64_t R, int64_t Vp, int64_t V, const uint8_t* mask = nullptr);
// dlogits (=) = (softmax - onehot(target)) * dloss * mask[r] in the first V columns, 0 in the
// padding: the gradient of dloss * sum_r mask[r] losses[r] (mask null: every mask[r] is 1).
void crossentropy_backward_ref(double* dlogits, const double* logits, const int32_t* targets,
                               int64_t R, int64_t Vp, int64_t V, double dloss,
                               const uint8_t* mask = nullptr);

}  // namespace memfit::kernels::ref
