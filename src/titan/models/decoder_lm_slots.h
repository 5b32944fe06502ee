// DecoderLM's kernel slots: one per (module, op kind) its forward calls, each starting on the
// running device's default kernel of its kind, and the constraints their kernels put on a step's
// shapes -- what [overrides] rebind and `titan plan` checks without building the model.
#pragma once

#include <cstdint>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/dtype.h"
#include "titan/dispatch/overrides.h"
#include "titan/models/model_args.h"

namespace titan {

// The slots of a decoder of `args` whose matmuls compute in `compute` (f32 or bf16), on `device`'s
// default kernels (model.attn_backend names the CPU's attention kernel; another device's slot
// takes that device's default); titan::Error naming the op kind where the device has none.
std::vector<KernelSlot> decoder_lm_default_slots(const ModelArgs& args, DType compute,
                                                 DeviceKind device);
// Every attention and experts slot's kernel checked on the shapes a step of (batch, seq) tokens
// hands it: a broken constraint is a titan::Error naming the module.
void check_decoder_lm_slot_constraints(const std::vector<KernelSlot>& slots, const ModelArgs& args,
                                       int64_t batch, int64_t seq);

}  // namespace titan
