#include "titan/infer/device.h"

#include "titan/core/error.h"

namespace titan {

void check_inference_device(const std::string& device) {
  if (device == "cpu") return;
  const std::string kind = device.substr(0, device.find(':'));  // cuda:1 -> cuda
  if (kind == "cuda" || kind == "neuron") {
    fail("device '", device, "' is not available: this titan has only the cpu backend (use ",
         "--device cpu)");
  }
  fail("unknown device '", device, "' (titan knows cpu, cuda and neuron; available here: cpu)");
}

}  // namespace titan
