#include "titan/ops/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "titan/backend/backend.h"
#include "titan/ops/host_parallel.h"

namespace titan {
void add_into(float* y, const float* x, int64_t n) {
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t at = 0; at < n; at += kElementwiseChunk)
    v.axpy(y + at, 1.0f, x + at, std::min(kElementwiseChunk, n - at));
}

void scale_in_place(float* x, float a, int64_t n) {
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t at = 0; at < n; at += kElementwiseChunk)
    v.scale(x + at, a, std::min(kElementwiseChunk, n - at));
}

void transpose(float* dst, const float* src, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  }
}

double sum_squares_f64(const float* x, int64_t n) {
  double sum = 0.0;
#pragma omp parallel for reduction(+ : sum) schedule(static)
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

int64_t find_nonfinite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return i;
  }
  return -1;
}

}  // namespace titan
