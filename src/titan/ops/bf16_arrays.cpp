#include "titan/ops/bf16_arrays.h"

#include <algorithm>

#include "titan/backend/backend.h"
#include "titan/ops/host_parallel.h"

namespace titan {
void round_to_bf16(uint16_t* dst, const float* x, int64_t n) {
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; i += kElementwiseChunk)
    v.round_to_bf16(dst + i, x + i, 1.0f, std::min(kElementwiseChunk, n - i));
}

void widen_bf16(float* dst, const uint16_t* x, int64_t n) {
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; i += kElementwiseChunk)
    v.widen_bf16(dst + i, x + i, std::min(kElementwiseChunk, n - i));
}

void round_to_bf16_keeping(float* values, uint16_t* bits, int64_t n) {
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; i += kElementwiseChunk) {
    uint16_t own[kElementwiseChunk];
    uint16_t* b = bits != nullptr ? bits + i : own;
    const int64_t len = std::min(kElementwiseChunk, n - i);
    v.round_to_bf16(b, values + i, 1.0f, len);
    v.widen_bf16(values + i, b, len);
  }
}

}  // namespace titan
