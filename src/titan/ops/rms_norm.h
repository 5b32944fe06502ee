// RMSNorm with fp32 statistics, in Hugging Face's order: normalise, then multiply by the weight.
// The same kernel serves the per-head q_norm/k_norm form: rows are then (token, head) pairs and
// dim is head_dim.
#pragma once

#include <cstdint>

namespace titan {

// out (R, d) = weight (d) * (x (R, d) * rstd), rstd (R) = 1 / sqrt(mean(x^2) + eps), saved for
// the backward. out may alias x.
void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t rows,
                      int64_t dim, float eps);
// dx (R, d) = d out / d x; dweight (d) += sum over rows, or null (a frozen weight: LoRA's base).
// dx may alias dout.
void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x,
                       const float* weight, const float* rstd, int64_t rows, int64_t dim);

// Plain fp32 references (serial, fp64 sums) for tests and verify-kernels.
void rms_norm_forward_reference(float* out, float* rstd, const float* x, const float* weight,
                                int64_t rows, int64_t dim, float eps);
void rms_norm_backward_reference(float* dx, float* dweight, const float* dout, const float* x,
                                 const float* weight, const float* rstd, int64_t rows, int64_t dim);

}  // namespace titan
