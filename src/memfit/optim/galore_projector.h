// GaLore's projector (Note [GaLore], docs/notes/galore.md): the rank-r singular vectors of one
// gradient matrix G (m x n) on its smaller side, from an SVD (Eigen's BDCSVD, in double, on one
// thread), each vector's sign fixed so that its entry of largest magnitude is positive. The
// authors' code (galore_torch, GaLoreProjector with proj_type "std") keeps torch.linalg.svd's
// signs, which LAPACK leaves arbitrary; fixing them makes the projector a function of G alone,
// so every range of a run, a resumed run and the PyTorch reference
// (tests/reference/make_galore_fixture.py, which fixes them the same way) agree.
#pragma once

#include <cstdint>

namespace memfit {

// Whether G (m x n) is projected on its columns (m >= n: P is r x n, the top right singular
// vectors as rows, R = G P^T is m x r) or on its rows (m < n: P is m x r, the top left singular
// vectors as columns, R = P^T G is r x n). galore_torch's "right" and "left".
inline bool galore_projects_columns(int64_t m, int64_t n) { return m >= n; }

// Writes P (r x n or m x r, row-major, as above) of G (m x n, row-major f32) into `proj`.
// r <= min(m, n). The same bits for the same G on any thread count and any ISA cap (Eigen's
// scalar-or-SSE code is compiled once, without OpenMP).
void galore_projector(const float* g, int64_t m, int64_t n, int64_t r, float* proj);

// FLOPs of one projector (the SVD of an m x n matrix, singular vectors of the smaller side,
// Golub and Van Loan's R-SVD count 2 l s^2 + 11 s^3 for l = max(m, n), s = min(m, n)).
double galore_svd_flops(int64_t m, int64_t n);

}  // namespace memfit
