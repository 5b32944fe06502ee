// training.allow_tf32 reaching the backend: whether a GPU's fp32 GEMMs may use TF32 (cuBLASLt's
// CUBLAS_COMPUTE_32F_FAST_TF32), and the fp32 peak MFU is measured against with it (the datasheet's
// TF32 figure). Off unless set, as in PyTorch since 1.12.
#pragma once

#include "titan/backend/backend.h"

namespace titan {

// On CUDA, fp32 GEMMs from now on use TF32 when `allow` (else fp32 arithmetic); the CPU has no
// TF32 and is left as it is (the job config warns of the key there).
void set_allow_tf32(Backend& device, bool allow);

}  // namespace titan
