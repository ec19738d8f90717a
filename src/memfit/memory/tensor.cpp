#include "memfit/memory/tensor.h"

#include <cstring>

namespace memfit {

std::string_view device_name(Device d) { return d == Device::cpu ? "cpu" : "cuda"; }

Shape contiguous_strides(const Shape& shape) {
  Shape strides = shape;
  int64_t s = 1;
  for (int i = shape.rank() - 1; i >= 0; --i) {
    strides[i] = s;
    s *= shape[i];
  }
  return strides;
}

Tensor Tensor::empty(MemoryPool& pool, Shape shape, DType dtype, Category category,
                     std::string_view tag) {
  Tensor t;
  size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  t.storage_ = std::make_shared<Allocation>(pool.allocate(bytes, category, tag));
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

bool Tensor::is_contiguous() const { return strides_ == contiguous_strides(shape_); }

void* Tensor::raw_data() const {
  MEMFIT_CHECK(storage_, "tensor", "data of an undefined tensor");
  return static_cast<char*>(storage_->data()) + byte_offset_;
}

Tensor Tensor::view(int64_t element_offset, Shape shape) const {
  MEMFIT_CHECK(storage_, "tensor.view", "view of an undefined tensor");
  MEMFIT_CHECK_SHAPE(is_contiguous(), "tensor.view", "view of a non-contiguous tensor {}", shape_);
  MEMFIT_CHECK_SHAPE(element_offset >= 0 && element_offset + shape.numel() <= numel(),
                     "tensor.view", "view {} at offset {} exceeds tensor {} ({} elements)", shape,
                     element_offset, shape_, numel());
  Tensor t = *this;
  t.byte_offset_ += static_cast<size_t>(element_offset) * dtype_size(dtype_);
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::view_bytes(size_t byte_offset, Shape shape, DType dtype) const {
  MEMFIT_CHECK(storage_, "tensor.view_bytes", "view of an undefined tensor");
  MEMFIT_CHECK_SHAPE(is_contiguous(), "tensor.view_bytes", "view of a non-contiguous tensor {}",
                     shape_);
  const size_t bytes = static_cast<size_t>(shape.numel()) * dtype_size(dtype);
  MEMFIT_CHECK_SHAPE(byte_offset % dtype_size(dtype) == 0 && byte_offset + bytes <= nbytes(),
                     "tensor.view_bytes", "{} view {} at byte {} exceeds tensor {} ({} bytes)",
                     dtype_name(dtype), shape, byte_offset, shape_, nbytes());
  Tensor t = *this;
  t.byte_offset_ += byte_offset;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.dtype_ = dtype;
  return t;
}

Tensor Tensor::reshape(Shape shape) const {
  MEMFIT_CHECK_SHAPE(shape.numel() == numel(), "tensor.reshape", "cannot reshape {} to {}", shape_,
                     shape);
  return view(0, shape);
}

Tensor Tensor::slice(int64_t begin, int64_t end) const {
  MEMFIT_CHECK_SHAPE(rank() >= 1 && 0 <= begin && begin <= end && end <= shape_[0], "tensor.slice",
                     "rows [{}, {}) of {}", begin, end, shape_);
  Shape s = shape_;
  s[0] = end - begin;
  return view(begin * (rank() ? strides_[0] : 1), s);
}

void Tensor::zero() { std::memset(raw_data(), 0, nbytes()); }

}  // namespace memfit
