// nn.Linear without bias: y = x W^T, W (out, in) as in Hugging Face checkpoints.
#pragma once

#include <cstdint>

namespace titan {

// y (N, out) = x (N, in) W^T
void linear_forward(float* y, const float* x, const float* weight, int64_t n_rows,
                    int64_t in_features, int64_t out_features);
// dx (N, in) = dy W (overwritten, or added to when accumulate_dx); dweight (out, in) += dy^T x.
void linear_backward(float* dx, float* dweight, const float* dy, const float* x,
                     const float* weight, int64_t n_rows, int64_t in_features, int64_t out_features,
                     bool accumulate_dx);

// The same contract on gemm_f32_reference.
void linear_forward_reference(float* y, const float* x, const float* weight, int64_t n_rows,
                              int64_t in_features, int64_t out_features);
void linear_backward_reference(float* dx, float* dweight, const float* dy, const float* x,
                               const float* weight, int64_t n_rows, int64_t in_features,
                               int64_t out_features, bool accumulate_dx);

}  // namespace titan
