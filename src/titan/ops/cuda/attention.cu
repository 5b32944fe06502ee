// Causal GQA attention on CUDA, the simple kernel of attention_rows.h (correct first, not fast):
// the forward and dq one block per (batch, query, head), dk and dv one block per (batch, key, kv
// head); the same kernels over bf16 q, k, v and out for mixed-precision training (the bodies' T).
// No packed rows (the kernel's entry does not declare them).
#include <climits>

#include "titan/ops/cuda/attention_rows.h"
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/team.cuh"

namespace titan::cuda_ops {
namespace {

using cuda_rows::AttentionDims;
using cuda_rows::BlockTeam;
using cuda_rows::kRowThreads;

template <typename T>
__global__ void forward_kernel(float* out, float* lse, const T* q, const T* k, const T* v,
                               AttentionDims s) {
  __shared__ float tile[kRowThreads];
  cuda_rows::attention_forward_query(BlockTeam{}, tile, out, lse, q, k, v, s, blockIdx.x);
}

template <typename T>
__global__ void backward_query_kernel(float* dq, const float* dout, const T* q, const T* k,
                                      const T* v, const T* out, const float* lse, AttentionDims s) {
  __shared__ float tile[kRowThreads];
  cuda_rows::attention_backward_query(BlockTeam{}, tile, dq, dout, q, k, v, out, lse, s,
                                      blockIdx.x);
}

template <typename T>
__global__ void backward_key_kernel(float* dk, float* dv, const float* dout, const T* q, const T* k,
                                    const T* v, const T* out, const float* lse, AttentionDims s) {
  __shared__ float tile[2 * kRowThreads];
  cuda_rows::attention_backward_key(BlockTeam{}, tile, dk, dv, dout, q, k, v, out, lse, s,
                                    blockIdx.x);
}

// The shape checked (attention_check_shape on its sizes) and as the row bodies take it.
AttentionDims dims_of(const AttentionShape& s) {
  AttentionShape sizes = s;
  sizes.segment_start = nullptr;  // device memory here; the kernel refuses packed rows anyway
  attention_check_shape(sizes);
  TITAN_CHECK(s.segment_start == nullptr,
              "CUDA attention requires one sequence per row (it does not take packed rows)");
  const std::string refused = attention_check(s);
  TITAN_CHECK(refused.empty(), "CUDA attention requires ", refused);
  return {s.batch,
          s.seq_q,
          s.seq_kv,
          s.n_heads,
          s.n_kv_heads,
          s.head_dim,
          1.0f / sqrtf(static_cast<float>(s.head_dim))};
}

}  // namespace

std::string attention_check(const AttentionShape& s) {
  if (s.batch * s.seq_q * s.n_heads > INT_MAX || s.batch * s.seq_kv * s.n_kv_heads > INT_MAX) {
    return "batch x seq x heads <= 2^31 - 1 (one block per row)";
  }
  return {};
}

namespace {

template <typename T>
void launch_forward(float* out, float* lse, const T* q, const T* k, const T* v,
                    const AttentionShape& shape, const char* name) {
  const AttentionDims s = dims_of(shape);
  forward_kernel<T>
      <<<static_cast<unsigned>(s.batch * s.seq_q * s.heads), kRowThreads>>>(out, lse, q, k, v, s);
  check_launch(name);
}

template <typename T>
void launch_backward(float* dq, float* dk, float* dv, const float* dout, const T* q, const T* k,
                     const T* v, const T* out, const float* lse, const AttentionShape& shape,
                     const char* name) {
  const AttentionDims s = dims_of(shape);
  backward_query_kernel<T><<<static_cast<unsigned>(s.batch * s.seq_q * s.heads), kRowThreads>>>(
      dq, dout, q, k, v, out, lse, s);
  check_launch(name);
  backward_key_kernel<T><<<static_cast<unsigned>(s.batch * s.seq_kv * s.kv_heads), kRowThreads>>>(
      dk, dv, dout, q, k, v, out, lse, s);
  check_launch(name);
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       const AttentionShape& shape) {
  launch_forward(out, lse, q, k, v, shape, "attention_forward");
}

void attention_forward_bf16(float* out, float* lse, const uint16_t* q, const uint16_t* k,
                            const uint16_t* v, const AttentionShape& shape) {
  launch_forward(out, lse, q, k, v, shape, "attention_forward_bf16");
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        const AttentionShape& shape) {
  launch_backward(dq, dk, dv, dout, q, k, v, out, lse, shape, "attention_backward");
}

void attention_backward_bf16(float* dq, float* dk, float* dv, const float* dout, const uint16_t* q,
                             const uint16_t* k, const uint16_t* v, const uint16_t* out,
                             const float* lse, const AttentionShape& shape) {
  launch_backward(dq, dk, dv, dout, q, k, v, out, lse, shape, "attention_backward_bf16");
}

}  // namespace titan::cuda_ops
