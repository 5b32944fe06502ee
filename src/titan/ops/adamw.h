// AdamW over a flat buffer (PyTorch semantics: decoupled weight decay, bias correction).
#pragma once

#include <cstdint>

#include "titan/backend/vec_kernels.h"

namespace titan {

struct AdamWConfig {
  float lr = 8e-4f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
};

// One parameter array with its gradient and AdamW moments, all (n): what the step-wide ops take,
// every array of a step at once (DeviceOps::sum_squares_all and adamw_step_all; on CUDA one
// launch per 32 arrays, their pointers and sizes the kernel's parameter).
struct AdamWArrays {
  float* param = nullptr;
  float* grad = nullptr;
  float* exp_avg = nullptr;
  float* exp_avg_sq = nullptr;
  int64_t n = 0;
};

// The scalars of update number `step` (1-based) at learning rate `lr`.
AdamWScalars adamw_scalars(const AdamWConfig& config, float lr, int64_t step);

// param, exp_avg, exp_avg_sq updated in place from grad; all (n).
void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWScalars& scalars);

// fp64 reference of the same update.
void adamw_update_reference(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                            int64_t n, const AdamWScalars& scalars);

}  // namespace titan
