// RMSNorm's bodies (ops/rms_norm.h's contract), split over a team per row: the CUDA kernels
// (rms_norm.cu) and the host test (tests/unit/cuda_rows_test.cpp) run this same code.
#pragma once

#include <cmath>

#include "titan/ops/cuda/hd.h"

namespace titan::cuda_rows {

// out (d) = weight (d) * x (d) * rstd, rstd = 1 / sqrt(mean(x^2) + eps); `rstd` written by rank 0.
template <typename Team>
TITAN_HD void rms_norm_row_forward(const Team& team, float* out, float* rstd, const float* x,
                                   const float* weight, int64_t dim, float eps) {
  float part = 0.0f;
  for (int64_t i = team.rank(); i < dim; i += team.size()) part += x[i] * x[i];
  const float s = 1.0f / sqrtf(team.sum(part) / static_cast<float>(dim) + eps);
  for (int64_t i = team.rank(); i < dim; i += team.size()) out[i] = weight[i] * (x[i] * s);
  if (team.rank() == 0) *rstd = s;
}

// dx (d) = rstd * (dout * weight - n * mean(dout * weight * n)), n = x * rstd. dx may alias dout:
// every element is read (for the mean) before the barrier inside team.sum, then read and
// written by the same member.
template <typename Team>
TITAN_HD void rms_norm_row_backward(const Team& team, float* dx, const float* dout, const float* x,
                                    const float* weight, float rstd, int64_t dim) {
  float part = 0.0f;
  for (int64_t i = team.rank(); i < dim; i += team.size())
    part += dout[i] * weight[i] * x[i] * rstd;
  const float mean_dn_n = team.sum(part) / static_cast<float>(dim);
  for (int64_t i = team.rank(); i < dim; i += team.size()) {
    dx[i] = rstd * (dout[i] * weight[i] - x[i] * rstd * mean_dn_n);
  }
}

// dweight[col] += sum over rows of dout (rows, dim) * x * rstd (rows), rows in order: one
// column per device thread, so the sum is deterministic. Called before dx overwrites an aliased
// dout (rms_norm.cu runs it first).
TITAN_HD inline void rms_norm_dweight_column(float* dweight, const float* dout, const float* x,
                                             const float* rstd, int64_t rows, int64_t dim,
                                             int64_t col) {
  float acc = 0.0f;
  for (int64_t r = 0; r < rows; ++r) acc += dout[r * dim + col] * (x[r * dim + col] * rstd[r]);
  dweight[col] += acc;
}

}  // namespace titan::cuda_rows
