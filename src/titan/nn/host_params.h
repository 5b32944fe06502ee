// Host-side writers of parameters (the HF loader, training checkpoints' loader) read and write a
// group's values with the CPU. On a device its groups are the device's memory, so such a writer
// fills host copies of them instead, copied in through the backend afterwards; a writer of files
// (a checkpoint save, the HF export) reads them through the backend's copies one tensor at a time.
#pragma once

#include <functional>
#include <vector>

#include "titan/io/safetensors_writer.h"
#include "titan/nn/param_group.h"

namespace titan {

// Runs `write` on the parameters of `groups` (and their AdamW moments with
// `with_optimizer_state`): on the groups themselves where they are host memory, else on host
// copies (the same names and views, zero before `write`) whose parameters -- and moments -- are
// then copied into `groups` whole (padding included). Gradients are never copied.
void write_params_on_host(std::vector<ParamGroup>& groups, bool with_optimizer_state,
                          const std::function<void(std::vector<ParamGroup>&)>& write);

// Whether `groups` are a device's memory, which the host cannot read (false for host memory);
// titan::Error when some are and some are not.
bool in_device_memory(const std::vector<ParamGroup>& groups);

// Makes a write of tensors in the active backend's device memory read each through the backend's
// copy into a host buffer in its staging memory (pinned on CUDA), one tensor at a time.
void read_through_backend(SafetensorsWriteOptions& options);

}  // namespace titan
