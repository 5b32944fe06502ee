// What a LoRA step adds on CUDA (lora_rows.h): the dropout, one thread per element, each drawing
// its own keep/drop from the hash, so the mask is the CPU's for the same call and nothing is
// stored; and B's transpose, one thread per element of the result. The adapter's GEMMs are the
// backend's (the base linear's kernel).
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/lora_rows.h"
#include "titan/ops/cuda/team.cuh"

namespace titan::cuda_ops {
namespace {

__device__ int64_t element() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__global__ void lora_dropout_kernel(float* dst, const float* x, int64_t n, int64_t features,
                                    cuda_rows::DropoutKey key, bool accumulate) {
  const int64_t e = element();
  if (e < n) cuda_rows::lora_dropout_element(dst, x, features, key, accumulate, e);
}

__global__ void transpose_kernel(float* dst, const float* src, int64_t rows, int64_t cols) {
  const int64_t e = element();
  if (e < rows * cols) cuda_rows::transpose_element(dst, src, rows, cols, e);
}

constexpr int kThreads = 256;

}  // namespace

void lora_dropout(float* dst, const float* x, int64_t n, int64_t features,
                  const LoraDropoutCall& call, bool accumulate) {
  const int64_t elements = n * features;
  if (elements <= 0) return;
  const cuda_rows::DropoutKey key{call.p,       static_cast<float>(1.0 / (1.0 - call.p)),
                                  call.key,     call.first_row,
                                  call.seq_len, call.first_feature};
  lora_dropout_kernel<<<blocks_for(elements, kThreads), kThreads>>>(dst, x, elements, features, key,
                                                                    accumulate);
  check_launch("lora_dropout");
}

void transpose(float* dst, const float* src, int64_t rows, int64_t cols) {
  if (rows * cols <= 0) return;
  transpose_kernel<<<blocks_for(rows * cols, kThreads), kThreads>>>(dst, src, rows, cols);
  check_launch("transpose");
}

}  // namespace titan::cuda_ops
