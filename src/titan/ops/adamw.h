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

// The scalars of update number `step` (1-based) at learning rate `lr`.
AdamWScalars adamw_scalars(const AdamWConfig& config, float lr, int64_t step);

// param, exp_avg, exp_avg_sq updated in place from grad; all (n).
void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWScalars& scalars);

// fp64 reference of the same update.
void adamw_update_reference(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                            int64_t n, const AdamWScalars& scalars);

}  // namespace titan
