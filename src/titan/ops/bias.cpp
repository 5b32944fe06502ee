#include "titan/ops/bias.h"

#include <algorithm>

#include "titan/ops/host_parallel.h"

namespace titan {

void bias_forward(float* y, const float* bias, int64_t n_rows, int64_t out_features) {
#pragma omp parallel for schedule(static) if (n_rows * out_features >= kMinParallelElements)
  for (int64_t r = 0; r < n_rows; ++r) {
    float* row = y + r * out_features;
#pragma omp simd
    for (int64_t j = 0; j < out_features; ++j) row[j] += bias[j];
  }
}

void bias_backward(float* dbias, const float* dy, int64_t n_rows, int64_t out_features) {
  // Threads own column blocks, so every column is summed by one thread in row order.
  constexpr int64_t kBlock = 256;
  const int64_t blocks = (out_features + kBlock - 1) / kBlock;
#pragma omp parallel for schedule(static) if (n_rows * out_features >= kMinParallelElements)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t j0 = b * kBlock, j1 = std::min(out_features, j0 + kBlock);
    for (int64_t r = 0; r < n_rows; ++r) {
      const float* row = dy + r * out_features;
#pragma omp simd
      for (int64_t j = j0; j < j1; ++j) dbias[j] += row[j];
    }
  }
}

}  // namespace titan
