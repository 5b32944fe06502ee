#include "titan/backend/backend.h"

#include <charconv>
#include <map>
#include <memory>
#include <mutex>

#include "titan/backend/allow_tf32.h"
#include "titan/backend/cpu/cpu_backend.h"
#include "titan/backend/cuda/cuda_backend.h"
#include "titan/backend/device_memory.h"
#include "titan/core/error.h"

namespace titan {

const char* device_kind_name(DeviceKind kind) {
  return kind == DeviceKind::cuda ? "cuda" : "cpu";
}
namespace {

Backend* g_active = nullptr;  // null: the CPU

}  // namespace

Backend& backend() {
  return g_active != nullptr ? *g_active : cpu_backend();
}

DeviceName parse_device_name(std::string_view name) {
  if (name == "cpu") return {DeviceKind::cpu, 0};
  if (name == "cuda") return {DeviceKind::cuda, 0};
  constexpr std::string_view kCuda = "cuda:";
  if (name.substr(0, kCuda.size()) == kCuda) {
    const std::string_view digits = name.substr(kCuda.size());
    int ordinal = -1;
    const auto [end, error] =
        std::from_chars(digits.data(), digits.data() + digits.size(), ordinal);
    if (!digits.empty() && error == std::errc() && end == digits.data() + digits.size() &&
        ordinal >= 0) {
      return {DeviceKind::cuda, ordinal};
    }
  }
  fail("unknown device '", name, "' (cpu, cuda or cuda:N)");
}

Backend& backend_named(std::string_view name) {
  const DeviceName device = parse_device_name(name);
  if (device.kind == DeviceKind::cpu) return cpu_backend();
  // Each device's created once, on first request: without the device that request is the error.
  static std::mutex mutex;
  static std::map<int, std::unique_ptr<Backend>> cuda;
  const std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Backend>& made = cuda[device.ordinal];
  if (made == nullptr) made = make_cuda_backend(device.ordinal);
  return *made;
}

void select_backend(std::string_view name) {
  g_active = &backend_named(name);
}

std::optional<size_t> device_memory_in_use(const Backend& device) {
  if (device.kind() == DeviceKind::cpu) return std::nullopt;
  return cuda_device_memory_in_use();
}

void set_allow_tf32(Backend& device, bool allow) {
  if (device.kind() == DeviceKind::cpu) return;
  cuda_set_allow_tf32(device, allow);
}

}  // namespace titan
