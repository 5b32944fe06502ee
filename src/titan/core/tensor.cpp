#include "titan/core/tensor.h"

#include <cstring>

#include "titan/core/error.h"

namespace titan {
namespace {

Shape contiguous_strides(const Shape& shape) {
  Shape strides(shape.size());
  int64_t stride = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    strides[i] = stride;
    stride *= shape[i];
  }
  return strides;
}

void check_dims(const Shape& shape) {
  for (int64_t d : shape) TITAN_CHECK(d >= 0, "negative dimension in shape ", shape_str(shape));
}

}  // namespace

std::string shape_str(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

int64_t shape_numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Tensor Tensor::empty(const Shape& shape, DType dtype, MemCategory category) {
  check_dims(shape);
  Tensor t;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  t.owner_ = std::make_shared<Buffer>(
      host_memory(), static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype), category);
  t.data_ = t.owner_->data();
  return t;
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, MemCategory category) {
  Tensor t = empty(shape, dtype, category);
  t.zero();
  return t;
}

Tensor Tensor::view(void* data, const Shape& shape, DType dtype) {
  check_dims(shape);
  Tensor t;
  t.data_ = data;
  t.dtype_ = dtype;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

int64_t Tensor::size(int dim) const {
  const int n = ndim();
  const int d = dim < 0 ? dim + n : dim;
  TITAN_CHECK(d >= 0 && d < n, "dimension ", dim, " out of range for shape ", shape_str(shape_));
  return shape_[d];
}

bool Tensor::is_contiguous() const {
  return strides_ == contiguous_strides(shape_);
}

Tensor Tensor::reshape(const Shape& shape) const {
  TITAN_CHECK(is_contiguous(), "reshape of a non-contiguous tensor ", shape_str(shape_));
  TITAN_CHECK(shape_numel(shape) == numel(), "cannot reshape ", shape_str(shape_), " to ",
              shape_str(shape));
  Tensor t = *this;
  t.shape_ = shape;
  t.strides_ = contiguous_strides(shape);
  return t;
}

Tensor Tensor::narrow0(int64_t start, int64_t length) const {
  TITAN_CHECK(ndim() >= 1 && start >= 0 && length >= 0 && start + length <= shape_[0], "rows [",
              start, ", ", start + length, ") out of range for shape ", shape_str(shape_));
  Tensor t = *this;
  t.shape_[0] = length;
  t.data_ =
      static_cast<char*>(data_) + start * strides_[0] * static_cast<int64_t>(dtype_size(dtype_));
  return t;
}

void Tensor::zero() {
  TITAN_CHECK(is_contiguous(), "zero() of a non-contiguous tensor");
  if (data_ != nullptr) std::memset(data_, 0, nbytes());
}

void check_shape(const Tensor& t, const Shape& expected, const char* what) {
  TITAN_CHECK(t.shape() == expected, what, ": expected shape ", shape_str(expected), ", got ",
              shape_str(t.shape()));
}

}  // namespace titan
