// LoRA's dropout on CUDA: one thread per element (lora_dropout_rows.h), each drawing its own
// keep/drop from the hash, so the mask is the CPU's for the same call and nothing is stored.
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/lora_dropout_rows.h"
#include "titan/ops/cuda/team.cuh"

namespace titan::cuda_ops {
namespace {

__global__ void lora_dropout_kernel(float* dst, const float* x, int64_t n, int64_t features,
                                    cuda_rows::DropoutKey key, bool accumulate) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) cuda_rows::lora_dropout_element(dst, x, features, key, accumulate, e);
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

}  // namespace titan::cuda_ops
