#include "titan/ops/swiglu.h"

#include <algorithm>
#include <cmath>

#include "titan/backend/backend.h"
#include "titan/ops/host_parallel.h"

namespace titan {
namespace {

constexpr int64_t kChunk = 4096;
// The bf16 forms' chunk: its fp32 widenings live on the stack.
constexpr int64_t kBf16Chunk = 1024;

// act (len <= kBf16Chunk) = bf16(silu(gate) * up) over gate and up in bf16, the product computed
// in fp32 as swiglu_forward does. The forward and the backward's recomputation both go through
// here in the same chunks, so they agree bit for bit.
void swiglu_chunk_bf16(uint16_t* act, const uint16_t* gate, const uint16_t* up, int64_t len,
                       const VecKernels& v) {
  float gate_f32[kBf16Chunk], up_f32[kBf16Chunk], product[kBf16Chunk];
  v.widen_bf16(gate_f32, gate, len);
  v.widen_bf16(up_f32, up, len);
  v.silu_mul(product, gate_f32, up_f32, len);
  v.round_to_bf16(act, product, 1.0f, len);
}

}  // namespace

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

void swiglu_forward_bf16(uint16_t* act, uint16_t* gate_kept, uint16_t* up_kept, const float* gate,
                         const float* up, int64_t n) {
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; i += kBf16Chunk) {
    uint16_t gate_own[kBf16Chunk], up_own[kBf16Chunk];
    const int64_t len = std::min(kBf16Chunk, n - i);
    uint16_t* gate_bf16 = gate_kept != nullptr ? gate_kept + i : gate_own;
    uint16_t* up_bf16 = up_kept != nullptr ? up_kept + i : up_own;
    v.round_to_bf16(gate_bf16, gate + i, 1.0f, len);
    v.round_to_bf16(up_bf16, up + i, 1.0f, len);
    swiglu_chunk_bf16(act + i, gate_bf16, up_bf16, len, v);
  }
}

void swiglu_recompute_bf16(uint16_t* act, const uint16_t* gate, const uint16_t* up, int64_t n) {
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; i += kBf16Chunk) {
    swiglu_chunk_bf16(act + i, gate + i, up + i, std::min(kBf16Chunk, n - i), v);
  }
}

void swiglu_backward_bf16(uint16_t* dgate, uint16_t* dup, const float* dout, const uint16_t* gate,
                          const uint16_t* up, int64_t n) {
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static) if (n >= kMinParallelElements)
  for (int64_t i = 0; i < n; i += kBf16Chunk) {
    float gate_f32[kBf16Chunk], up_f32[kBf16Chunk], dgate_f32[kBf16Chunk], dup_f32[kBf16Chunk];
    const int64_t len = std::min(kBf16Chunk, n - i);
    v.widen_bf16(gate_f32, gate + i, len);
    v.widen_bf16(up_f32, up + i, len);
    v.silu_mul_backward(dgate_f32, dup_f32, dout + i, gate_f32, up_f32, len);
    v.round_to_bf16(dgate + i, dgate_f32, 1.0f, len);
    v.round_to_bf16(dup + i, dup_f32, 1.0f, len);
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
