// The embedding on CUDA: the gather one thread per element, the scatter-add one thread per
// column over the tokens in order (deterministic, the CPU's order of repeated ids; parallel only
// over the hidden dim -- simple before fast). Ids are checked on the device first (one read back).
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/elementwise_rows.h"
#include "titan/ops/cuda/team.cuh"

namespace titan::cuda_ops {
namespace {

constexpr int kThreads = 256;

__global__ void gather_kernel(float* out, const int32_t* ids, const float* weight, int64_t dim,
                              int64_t n) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) cuda_rows::embedding_gather_element(out, ids, weight, dim, e);
}

__global__ void gather_bf16_kernel(float* out, const int32_t* ids, const uint16_t* weight,
                                   int64_t dim, int64_t n) {
  const int64_t e = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e < n) cuda_rows::embedding_gather_element_bf16(out, ids, weight, dim, e);
}

// The ids checked against the vocabulary, as the CPU's lookup checks them.
void check_ids(const int32_t* ids, int64_t n_tokens, int64_t vocab, int64_t dim) {
  TITAN_CHECK(n_tokens >= 0 && vocab > 0 && dim > 0, "CUDA embedding: bad sizes (tokens ", n_tokens,
              ", vocab ", vocab, ", dim ", dim, ")");
  int32_t id = 0;
  const int64_t bad = first_id_outside(ids, n_tokens, 0, vocab, &id);
  TITAN_CHECK(bad < 0, "token id ", id, " at position ", bad, " is outside the vocabulary [0, ",
              vocab, ")");
}

__global__ void scatter_kernel(float* dweight, const float* dout, const int32_t* ids,
                               int64_t n_tokens, int64_t dim) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col < dim) cuda_rows::embedding_scatter_column(dweight, dout, ids, n_tokens, dim, col);
}

}  // namespace

void embedding_forward(float* out, const int32_t* ids, const float* weight, int64_t n_tokens,
                       int64_t vocab, int64_t dim) {
  check_ids(ids, n_tokens, vocab, dim);
  if (n_tokens == 0) return;
  gather_kernel<<<blocks_for(n_tokens * dim, kThreads), kThreads>>>(out, ids, weight, dim,
                                                                    n_tokens * dim);
  check_launch("embedding_forward");
}

void embedding_forward_bf16(float* out, const int32_t* ids, const uint16_t* weight,
                            int64_t n_tokens, int64_t vocab, int64_t dim) {
  check_ids(ids, n_tokens, vocab, dim);
  if (n_tokens == 0) return;
  gather_bf16_kernel<<<blocks_for(n_tokens * dim, kThreads), kThreads>>>(out, ids, weight, dim,
                                                                         n_tokens * dim);
  check_launch("embedding_forward_bf16");
}

// The ids were checked by the forward of the same step.
void embedding_backward(float* dweight, const float* dout, const int32_t* ids, int64_t n_tokens,
                        int64_t dim) {
  if (n_tokens <= 0) return;
  scatter_kernel<<<blocks_for(dim, kThreads), kThreads>>>(dweight, dout, ids, n_tokens, dim);
  check_launch("embedding_backward");
}

}  // namespace titan::cuda_ops
