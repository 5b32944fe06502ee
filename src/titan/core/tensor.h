// A tensor: element type, shape, strides and a pointer, optionally owning its storage.
// Views into flat parameter buffers do not own; activations and temporaries own a Buffer.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/core/dtype.h"

namespace titan {

using Shape = std::vector<int64_t>;

std::string shape_str(const Shape& shape);  // "[2, 3]"
int64_t shape_numel(const Shape& shape);

class Tensor {
 public:
  Tensor() = default;

  // Owning, uninitialised / zero-filled, charged to `category`.
  static Tensor empty(const Shape& shape, DType dtype, MemCategory category);
  static Tensor zeros(const Shape& shape, DType dtype, MemCategory category);
  // Non-owning, contiguous view of memory someone else keeps alive.
  static Tensor view(void* data, const Shape& shape, DType dtype);

  template <typename T>
  T* data() const {
    return static_cast<T*>(data_);
  }
  void* raw() const { return data_; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  const Shape& strides() const { return strides_; }
  int ndim() const { return static_cast<int>(shape_.size()); }
  int64_t size(int dim) const;  // negative dims count from the end
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  bool defined() const { return data_ != nullptr || numel() == 0; }
  bool is_contiguous() const;

  // Same storage, new shape (contiguous tensors only; the element count must agree).
  Tensor reshape(const Shape& shape) const;
  // Rows [start, start+length) along dimension 0.
  Tensor narrow0(int64_t start, int64_t length) const;
  void zero();

 private:
  void* data_ = nullptr;
  DType dtype_ = DType::f32;
  Shape shape_;
  Shape strides_;
  std::shared_ptr<Buffer> owner_;
};

// Throws a titan::Error naming `what` unless `t` has exactly `expected` as its shape.
void check_shape(const Tensor& t, const Shape& expected, const char* what);

}  // namespace titan
