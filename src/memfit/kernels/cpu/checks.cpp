#include "memfit/kernels/cpu/checks.h"

#include "memfit/kernels/cpu/half_vec.h"

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

namespace {

// Defined and of f32, bf16 or f16: the part both checks below share.
void expect_float_dtype(const Tensor& t, std::string_view op, std::string_view name) {
  MEMFIT_CHECK(t.defined(), op, "{} is undefined", name);
  MEMFIT_CHECK_DTYPE(half::is_float_type(t.dtype()), op, "{} must be f32, bf16 or f16, got {} {}",
                     name, dtype_name(t.dtype()), t.shape());
}

}  // namespace

const Shape& expect_float_any_shape(const Tensor& t, std::string_view op, std::string_view name) {
  expect_float_dtype(t, op, name);
  return expect_any_shape(t, op, name, t.dtype());
}

void expect_float_tensor(const Tensor& t, std::string_view op, std::string_view name,
                         const Shape& shape) {
  expect_float_dtype(t, op, name);
  expect_tensor(t, op, name, shape, t.dtype());
}

}  // namespace memfit::kernels
