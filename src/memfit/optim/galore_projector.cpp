// GaLore's projector from an SVD (galore_projector.h): Eigen's divide-and-conquer SVD in double
// on one thread (EIGEN_DONT_PARALLELIZE: the result must not depend on the OpenMP team), the
// signs made canonical, the vectors rounded once to f32.
#define EIGEN_DONT_PARALLELIZE
#include "memfit/optim/galore_projector.h"

#include <Eigen/SVD>
#include <cmath>

#include "memfit/core/error.h"

namespace memfit {

void galore_projector(const float* g, int64_t m, int64_t n, int64_t r, float* proj) {
  MEMFIT_CHECK(r >= 1 && r <= std::min(m, n), "galore",
               "projector rank {} outside [1, {}] for a ({}, {}) gradient", r, std::min(m, n), m,
               n);
  using RowMajorF = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const Eigen::MatrixXd a = Eigen::Map<const RowMajorF>(g, m, n).cast<double>();
  const bool columns = galore_projects_columns(m, n);
  const Eigen::BDCSVD<Eigen::MatrixXd> svd(a, columns ? Eigen::ComputeThinV : Eigen::ComputeThinU);
  MEMFIT_CHECK(svd.info() == Eigen::Success, "galore", "the SVD of a ({}, {}) gradient failed",
               m, n);
  const Eigen::MatrixXd& vecs = columns ? svd.matrixV() : svd.matrixU();  // s x s, by column
  const int64_t s = vecs.rows();
  for (int64_t k = 0; k < r; ++k) {
    // The sign: the entry of largest magnitude (the first of equals) is made positive.
    int64_t top = 0;
    for (int64_t i = 1; i < s; ++i)
      if (std::abs(vecs(i, k)) > std::abs(vecs(top, k))) top = i;
    const double sign = vecs(top, k) < 0 ? -1.0 : 1.0;
    for (int64_t i = 0; i < s; ++i) {
      const float x = static_cast<float>(sign * vecs(i, k));
      if (columns)
        proj[k * s + i] = x;  // row k of P (r x n)
      else
        proj[i * r + k] = x;  // column k of P (m x r)
    }
  }
}

double galore_svd_flops(int64_t m, int64_t n) {
  const double l = static_cast<double>(std::max(m, n)), s = static_cast<double>(std::min(m, n));
  return 2.0 * l * s * s + 11.0 * s * s * s;
}

}  // namespace memfit
