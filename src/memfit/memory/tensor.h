// Tensor: a typed, shaped view into pool memory. Storage is shared, so a slab (all parameters,
// all gradients) is one allocation and each named parameter is a view into it, as in llm.c.
// Strides are kept for views; kernels ask for contiguous tensors and say so when they are not.
#pragma once

#include <memory>
#include <string_view>

#include "memfit/core/dtype.h"
#include "memfit/core/error.h"
#include "memfit/core/shape.h"
#include "memfit/memory/pool.h"

namespace memfit {

enum class Device : uint8_t { cpu, cuda };
std::string_view device_name(Device d);

class Tensor {
 public:
  Tensor() = default;

  // A new zero-filled tensor from the pool.
  static Tensor empty(MemoryPool& pool, Shape shape, DType dtype, Category category,
                      std::string_view tag);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t size(int dim) const { return shape_[dim]; }
  int rank() const { return shape_.rank(); }
  int64_t numel() const { return shape_.numel(); }
  int64_t stride(int dim) const { return strides_[dim < 0 ? dim + rank() : dim]; }
  DType dtype() const { return dtype_; }
  Device device() const { return Device::cpu; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  Category category() const { return storage_ ? storage_->category() : Category::workspace; }
  bool is_contiguous() const;

  void* raw_data() const;
  // Typed pointer; throws DTypeError if T is not the tensor's type.
  template <typename T>
  T* data() const {
    MEMFIT_CHECK_DTYPE(dtype_ == dtype_of<T>(), "tensor", "asked for {} data of a {} tensor {}",
                       dtype_name(dtype_of<T>()), dtype_name(dtype_), shape_);
    return static_cast<T*>(raw_data());
  }

  // A contiguous view of `shape` starting `element_offset` elements into this (contiguous)
  // tensor's storage; it must lie within it.
  Tensor view(int64_t element_offset, Shape shape) const;
  // A contiguous view of `shape` in `dtype` starting `byte_offset` bytes into this (contiguous)
  // tensor's storage: how a buffer lives in an arena slab. It must lie within the tensor, at an
  // offset aligned to the dtype's size.
  Tensor view_bytes(size_t byte_offset, Shape shape, DType dtype) const;
  // Same storage, new shape with the same element count.
  Tensor reshape(Shape shape) const;
  // Rows [begin, end) of the first dimension.
  Tensor slice(int64_t begin, int64_t end) const;

  void zero();

 private:
  std::shared_ptr<Allocation> storage_;
  size_t byte_offset_ = 0;
  Shape shape_;
  Shape strides_;
  DType dtype_ = DType::f32;
};

// Contiguous strides (in elements) of a shape.
Shape contiguous_strides(const Shape& shape);

}  // namespace memfit
