#include "memfit/kernels/cpu/checks.h"

namespace memfit::kernels {

const Shape& expect_any_shape(const Tensor& t, std::string_view op, std::string_view name,
                              DType dtype) {
  MEMFIT_CHECK(t.defined(), op, "{} is undefined", name);
  MEMFIT_CHECK_DTYPE(t.dtype() == dtype, op, "{} must be {}, got {} {}", name, dtype_name(dtype),
                     dtype_name(t.dtype()), t.shape());
  MEMFIT_CHECK_SHAPE(t.is_contiguous(), op, "{} {} must be contiguous", name, t.shape());
  return t.shape();
}

void expect_tensor(const Tensor& t, std::string_view op, std::string_view name, const Shape& shape,
                   DType dtype) {
  expect_any_shape(t, op, name, dtype);
  MEMFIT_CHECK_SHAPE(t.shape() == shape, op, "{} must be {}, got {}", name, shape, t.shape());
}

}  // namespace memfit::kernels
