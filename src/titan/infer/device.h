// The device titan generate and titan eval run on (--device): "cpu", "cuda" or "cuda:N", made the
// ops' backend before anything is allocated, as training.device is for a job
// (train/job_device.h), so the weights, the KV cache and the scratch are the device's memory and
// every kernel slot binds its kernels. Never a silent fallback to the CPU.
#pragma once

#include <string>

namespace titan {

// Selects `device` (backend/backend.h's select_backend and parse_device_name): titan::Error
// "--device X: ..." in one line for an unknown name, a build without CUDA or a machine without
// that device.
void select_inference_device(const std::string& device);

// What inference on a device other than the CPU cannot do yet, checked before the model folder
// `model_dir` is loaded: titan::Error naming the first (a MoE model -- no CUDA kernel for its
// router and experts --, a LoRA adapter merged at load). Nothing on the CPU.
void check_inference_on_device(const std::string& device, const std::string& model_dir,
                               const std::string& adapter);

}  // namespace titan
