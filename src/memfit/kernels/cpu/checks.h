// Argument checks shared by the kernels: each throws a typed error that names the operation,
// the argument and the shapes or dtypes at fault.
#pragma once

#include <string_view>

#include "memfit/memory/tensor.h"

namespace memfit::kernels {

// `t` must be defined, contiguous, of dtype `dtype` and shape `shape`.
void expect_tensor(const Tensor& t, std::string_view op, std::string_view name, const Shape& shape,
                   DType dtype = DType::f32);
// `t` must be defined, contiguous and of dtype `dtype`; returns its shape.
const Shape& expect_any_shape(const Tensor& t, std::string_view op, std::string_view name,
                              DType dtype = DType::f32);
// `t` must be defined, contiguous and of f32, bf16 or f16 (any of them); returns its shape.
const Shape& expect_float_any_shape(const Tensor& t, std::string_view op, std::string_view name);
// As expect_float_any_shape, and `t` must be of shape `shape`.
void expect_float_tensor(const Tensor& t, std::string_view op, std::string_view name,
                         const Shape& shape);

}  // namespace memfit::kernels
