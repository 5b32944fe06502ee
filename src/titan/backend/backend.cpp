#include "titan/backend/backend.h"

#include <memory>
#include <mutex>

#include "titan/backend/cpu/cpu_backend.h"
#include "titan/backend/cuda/cuda_backend.h"
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

Backend& backend_named(std::string_view name) {
  if (name == "cpu") return cpu_backend();
  if (name == "cuda") {
    // Created once, on first request: without a device that request is the error.
    static std::mutex mutex;
    static std::unique_ptr<Backend> cuda;
    const std::lock_guard<std::mutex> lock(mutex);
    if (cuda == nullptr) cuda = make_cuda_backend();
    return *cuda;
  }
  fail("unknown backend '", name, "' (titan knows cpu and cuda)");
}

void select_backend(std::string_view name) {
  g_active = &backend_named(name);
}

}  // namespace titan
