// Which device inference runs on. Only the CPU backend exists so far; a request for any other
// device is an error naming it, never a silent fallback to the CPU.
#pragma once

#include <string>

namespace titan {

// Returns normally for "cpu"; otherwise throws titan::Error saying the device is unavailable
// (cuda, neuron) or unknown.
void check_inference_device(const std::string& device);

}  // namespace titan
