// Typed, owning memory of one backend, and copies between it and the host.
#pragma once

#include <cstddef>
#include <cstdint>

#include "titan/backend/backend.h"

namespace titan {

// Owning, move-only block of one backend's memory holding `numel` elements of `dtype`.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(Backend& backend, int64_t numel, DType dtype, MemCategory category);
  ~DeviceBuffer();
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  Backend* backend() const { return backend_; }
  void* data() const { return data_; }
  int64_t numel() const { return numel_; }
  DType dtype() const { return dtype_; }
  size_t bytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void reset();

  Backend* backend_ = nullptr;
  void* data_ = nullptr;
  int64_t numel_ = 0;
  DType dtype_ = DType::f32;
  MemCategory category_ = MemCategory::other;
};

// Copies of whole buffers. The host side is `dst.numel()` (or `src.numel()`) elements of the
// buffer's dtype; device to device needs both buffers on one backend with one dtype and size.
// A mismatch is a titan::Error naming both sides.
void copy_from_host(DeviceBuffer& dst, const void* host_src, DType host_dtype, int64_t numel);
void copy_to_host(void* host_dst, DType host_dtype, int64_t numel, const DeviceBuffer& src);
void copy_buffer(DeviceBuffer& dst, const DeviceBuffer& src);

}  // namespace titan
