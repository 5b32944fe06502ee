#include "titan/ops/adamw.h"

#include <algorithm>
#include <cmath>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/ops/host_parallel.h"

namespace titan {

AdamWScalars adamw_scalars(const AdamWConfig& config, float lr, int64_t step) {
  TITAN_CHECK(step >= 1, "AdamW step must be at least 1, got ", step);
  AdamWScalars s;
  s.lr = lr;
  s.beta1 = config.beta1;
  s.beta2 = config.beta2;
  s.eps = config.eps;
  s.weight_decay = config.weight_decay;
  // torch computes these in Python floats (fp64) and passes them on as scalars.
  s.bias_correction1 = static_cast<float>(1.0 - std::pow(static_cast<double>(config.beta1), step));
  s.bias_correction2_sqrt =
      static_cast<float>(std::sqrt(1.0 - std::pow(static_cast<double>(config.beta2), step)));
  return s;
}

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWScalars& scalars) {
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += kElementwiseChunk) {
    v.adamw(param + i, grad + i, exp_avg + i, exp_avg_sq + i, std::min(kElementwiseChunk, n - i),
            scalars);
  }
}

void adamw_update_reference(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                            int64_t n, const AdamWScalars& s) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = grad[i];
    const double m = exp_avg[i] + (1.0 - s.beta1) * (g - exp_avg[i]);
    const double v = s.beta2 * static_cast<double>(exp_avg_sq[i]) + (1.0 - s.beta2) * g * g;
    exp_avg[i] = static_cast<float>(m);
    exp_avg_sq[i] = static_cast<float>(v);
    const double denom = std::sqrt(v) / s.bias_correction2_sqrt + s.eps;
    param[i] = static_cast<float>(param[i] * (1.0 - static_cast<double>(s.lr) * s.weight_decay) -
                                  s.lr / s.bias_correction1 * m / denom);
  }
}

}  // namespace titan
