#include "titan/ops/swiglu.h"

#include <algorithm>
#include <cmath>

#include "titan/backend/backend.h"
#include "titan/ops/host_parallel.h"

namespace titan {
namespace {
constexpr int64_t kChunk = 4096;
}

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; i += kChunk) {
    v.silu_mul(out + i, gate + i, up + i, std::min(kChunk, n - i));
  }
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n) {
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; i += kChunk) {
    v.silu_mul_backward(dgate + i, dup + i, dout + i, gate + i, up + i, std::min(kChunk, n - i));
  }
}

void swiglu_forward_reference(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void swiglu_backward_reference(float* dgate, float* dup, const float* dout, const float* gate,
                               const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i], sig = 1.0 / (1.0 + std::exp(-g));
    dup[i] = static_cast<float>(dout[i] * g * sig);
    dgate[i] = static_cast<float>(dout[i] * up[i] * sig * (1.0 + g * (1.0 - sig)));
  }
}

}  // namespace titan
