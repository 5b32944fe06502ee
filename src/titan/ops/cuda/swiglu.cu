// SwiGLU on CUDA: one thread per element (elementwise_rows.h); the bf16 forms round where the
// CPU's do (ops/swiglu.h): the product of the widened bf16 gate and up, and the gradients.
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/elementwise_rows.h"
#include "titan/ops/cuda/team.cuh"

namespace titan::cuda_ops {
namespace {

using cuda_rows::from_bf16;
using cuda_rows::to_bf16;

__device__ int64_t element() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__global__ void forward_kernel(float* out, const float* gate, const float* up, int64_t n) {
  const int64_t i = element();
  if (i < n) out[i] = cuda_rows::swiglu(gate[i], up[i]);
}

__global__ void backward_kernel(float* dgate, float* dup, const float* dout, const float* gate,
                                const float* up, int64_t n) {
  const int64_t i = element();
  if (i < n) cuda_rows::swiglu_backward_element(dgate + i, dup + i, dout[i], gate[i], up[i]);
}

__global__ void recompute_bf16_kernel(uint16_t* act, const uint16_t* gate, const uint16_t* up,
                                      int64_t n) {
  const int64_t i = element();
  if (i < n) act[i] = to_bf16(cuda_rows::swiglu(from_bf16(gate[i]), from_bf16(up[i])));
}

__global__ void backward_bf16_kernel(uint16_t* dgate, uint16_t* dup, const float* dout,
                                     const uint16_t* gate, const uint16_t* up, int64_t n) {
  const int64_t i = element();
  if (i >= n) return;
  float dg, du;
  cuda_rows::swiglu_backward_element(&dg, &du, dout[i], from_bf16(gate[i]), from_bf16(up[i]));
  dgate[i] = to_bf16(dg);
  dup[i] = to_bf16(du);
}

constexpr int kThreads = 256;

}  // namespace

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  if (n <= 0) return;
  forward_kernel<<<blocks_for(n, kThreads), kThreads>>>(out, gate, up, n);
  check_launch("swiglu_forward");
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n) {
  if (n <= 0) return;
  backward_kernel<<<blocks_for(n, kThreads), kThreads>>>(dgate, dup, dout, gate, up, n);
  check_launch("swiglu_backward");
}

void swiglu_recompute_bf16(uint16_t* act, const uint16_t* gate, const uint16_t* up, int64_t n) {
  if (n <= 0) return;
  recompute_bf16_kernel<<<blocks_for(n, kThreads), kThreads>>>(act, gate, up, n);
  check_launch("swiglu_recompute_bf16");
}

void swiglu_backward_bf16(uint16_t* dgate, uint16_t* dup, const float* dout, const uint16_t* gate,
                          const uint16_t* up, int64_t n) {
  if (n <= 0) return;
  backward_bf16_kernel<<<blocks_for(n, kThreads), kThreads>>>(dgate, dup, dout, gate, up, n);
  check_launch("swiglu_backward_bf16");
}

}  // namespace titan::cuda_ops
