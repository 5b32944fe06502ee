// The bias of nn.Linear(bias=True), kept apart from the GEMM so every linear kernel (and the
// fused decode GEMVs) serves biased and unbiased projections alike.
#pragma once

#include <cstdint>

namespace titan {

// y (N, out) += bias (out) on every row.
void bias_forward(float* y, const float* bias, int64_t n_rows, int64_t out_features);
// dbias (out) += the column sums of dy (N, out), each summed in row order (deterministic).
void bias_backward(float* dbias, const float* dy, int64_t n_rows, int64_t out_features);

}  // namespace titan
