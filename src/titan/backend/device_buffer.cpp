#include "titan/backend/device_buffer.h"

#include <string>
#include <utility>

#include "titan/core/error.h"

namespace titan {
namespace {

std::string describe(const DeviceBuffer& b) {
  return detail::concat(b.numel(), " x ", dtype_name(b.dtype()), " on ",
                        b.backend() == nullptr ? "no device" : b.backend()->name());
}

}  // namespace

DeviceBuffer::DeviceBuffer(Backend& backend, int64_t numel, DType dtype, MemCategory category)
    : backend_(&backend), numel_(numel), dtype_(dtype), category_(category) {
  TITAN_CHECK(numel >= 0, "device buffer of ", numel, " elements");
  data_ = bytes() == 0 ? nullptr : backend.allocate(bytes(), category);
}

DeviceBuffer::~DeviceBuffer() {
  reset();
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : backend_(std::exchange(other.backend_, nullptr)),
      data_(std::exchange(other.data_, nullptr)),
      numel_(std::exchange(other.numel_, 0)),
      dtype_(other.dtype_),
      category_(other.category_) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    reset();
    backend_ = std::exchange(other.backend_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    numel_ = std::exchange(other.numel_, 0);
    dtype_ = other.dtype_;
    category_ = other.category_;
  }
  return *this;
}

void DeviceBuffer::reset() {
  if (data_ != nullptr) backend_->release(data_, bytes(), category_);
  data_ = nullptr;
  numel_ = 0;
}

void copy_from_host(DeviceBuffer& dst, const void* host_src, DType host_dtype, int64_t numel) {
  TITAN_CHECK(host_dtype == dst.dtype() && numel == dst.numel(), "copy of ", numel, " x ",
              dtype_name(host_dtype), " from the host into a buffer of ", describe(dst));
  if (dst.bytes() > 0) dst.backend()->copy_from_host(dst.data(), host_src, dst.bytes());
}

void copy_to_host(void* host_dst, DType host_dtype, int64_t numel, const DeviceBuffer& src) {
  TITAN_CHECK(host_dtype == src.dtype() && numel == src.numel(), "copy of a buffer of ",
              describe(src), " to ", numel, " x ", dtype_name(host_dtype), " on the host");
  if (src.bytes() > 0) src.backend()->copy_to_host(host_dst, src.data(), src.bytes());
}

void copy_buffer(DeviceBuffer& dst, const DeviceBuffer& src) {
  TITAN_CHECK(
      dst.backend() == src.backend() && dst.dtype() == src.dtype() && dst.numel() == src.numel(),
      "copy of a buffer of ", describe(src), " into one of ", describe(dst),
      " (device to device needs one backend, dtype and size)");
  if (src.bytes() > 0) src.backend()->copy_on_device(dst.data(), src.data(), src.bytes());
}

}  // namespace titan
