// Host-side writers of parameters (the HF loader, training checkpoints' loader) read and write a
// group's values with the CPU. On a device its groups are the device's memory, so such a writer
// fills host copies of them instead, copied in through the backend afterwards.
#pragma once

#include <functional>
#include <vector>

#include "titan/nn/param_group.h"

namespace titan {

// Runs `write` on the parameters of `groups` (and their AdamW moments with
// `with_optimizer_state`): on the groups themselves where they are host memory, else on host
// copies (the same names and views, zero before `write`) whose parameters -- and moments -- are
// then copied into `groups` whole (padding included). Gradients are never copied.
void write_params_on_host(std::vector<ParamGroup>& groups, bool with_optimizer_state,
                          const std::function<void(std::vector<ParamGroup>&)>& write);

}  // namespace titan
