// Double-precision reference of softmax cross-entropy over padded vocabulary rows, checked by
// finite differences.
#pragma once

#include <cstdint>

namespace memfit::kernels::ref {

// logits (R, Vp) with the first V columns real; targets (R) in [0, V);
// losses[r] = -log softmax(logits[r, :V])[targets[r]].
void crossentropy_forward_ref(double* losses, const double* logits, const int32_t* targets,
                              int64_t R, int64_t Vp, int64_t V);
// dlogits (=) = (softmax - onehot(target)) * dloss in the first V columns, 0 in the padding:
// the gradient of dloss * sum_r losses[r].
void crossentropy_backward_ref(double* dlogits, const double* logits, const int32_t* targets,
                               int64_t R, int64_t Vp, int64_t V, double dloss);

}  // namespace memfit::kernels::ref
