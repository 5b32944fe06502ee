// The router's softmax and top-k on CUDA (ops/moe.h's router_topk_*): one thread per token, the
// experts of a token in one loop (E is at most a few hundred); and the load-balancing statistics'
// DeviceOps: the counts and probability sums one thread per expert onto the host's running totals
// (copied in and back, E values each), the gradient computed on the host as the CPU's and copied
// into device memory, where the router's backward reads it.
#include <cuda_runtime.h>

#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/moe_rows.h"
#include "titan/ops/cuda/team.cuh"
#include "titan/ops/moe.h"

namespace titan::cuda_ops {
namespace {

constexpr int kThreads = 128;

__device__ int64_t element() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__global__ void router_forward_kernel(int32_t* index, float* weight, float* probs,
                                      const float* logits, int64_t n_tokens, int64_t n_experts,
                                      int64_t top_k, bool norm_topk_prob) {
  const int64_t t = element();
  if (t < n_tokens) {
    cuda_rows::router_token_forward(index, weight, probs, logits, n_experts, top_k, norm_topk_prob,
                                    t);
  }
}

__global__ void router_backward_kernel(float* dlogits, const float* dweight,
                                       const float* dprobs_all, const float* probs,
                                       const int32_t* index, int64_t n_tokens, int64_t n_experts,
                                       int64_t top_k, bool norm_topk_prob) {
  const int64_t t = element();
  if (t < n_tokens) {
    cuda_rows::router_token_backward(dlogits, dweight, dprobs_all, probs, index, n_experts, top_k,
                                     norm_topk_prob, t);
  }
}

__global__ void load_balancing_kernel(double* counts, double* prob_sums, const float* probs,
                                      const int32_t* index, int64_t n_tokens, int64_t n_experts,
                                      int64_t top_k) {
  const int64_t e = element();
  if (e < n_experts) {
    cuda_rows::load_balancing_expert(counts, prob_sums, probs, index, n_tokens, n_experts, top_k,
                                     e);
  }
}

void check_cuda(cudaError_t status, const char* what) {
  TITAN_CHECK(status == cudaSuccess, "CUDA ", what, " failed: ", cudaGetErrorString(status));
}

}  // namespace

void router_topk_forward(int32_t* index, float* weight, float* probs, const float* logits,
                         int64_t n_tokens, int64_t n_experts, int64_t top_k, bool norm_topk_prob) {
  TITAN_CHECK(top_k >= 1 && top_k <= n_experts, "router: num_experts_per_tok (", top_k,
              ") must be in [1, num_experts = ", n_experts, "]");
  if (n_tokens <= 0) return;
  router_forward_kernel<<<blocks_for(n_tokens, kThreads), kThreads>>>(
      index, weight, probs, logits, n_tokens, n_experts, top_k, norm_topk_prob);
  check_launch("router_topk_forward");
}

void router_topk_backward(float* dlogits, const float* dweight, const float* dprobs_all,
                          const float* probs, const int32_t* index, int64_t n_tokens,
                          int64_t n_experts, int64_t top_k, bool norm_topk_prob) {
  if (n_tokens <= 0) return;
  router_backward_kernel<<<blocks_for(n_tokens, kThreads), kThreads>>>(
      dlogits, dweight, dprobs_all, probs, index, n_tokens, n_experts, top_k, norm_topk_prob);
  check_launch("router_topk_backward");
}

void load_balancing_accumulate(double* counts, double* prob_sums, const float* probs,
                               const int32_t* index, int64_t n_tokens, int64_t n_experts,
                               int64_t top_k) {
  if (n_experts <= 0) return;
  const size_t bytes = sizeof(double) * static_cast<size_t>(n_experts);
  Buffer totals(backend().memory(), 2 * bytes, MemCategory::other);  // counts, then prob_sums
  double* d_counts = totals.as<double>();
  double* d_sums = d_counts + n_experts;
  check_cuda(cudaMemcpy(d_counts, counts, bytes, cudaMemcpyHostToDevice), "cudaMemcpy (counts)");
  check_cuda(cudaMemcpy(d_sums, prob_sums, bytes, cudaMemcpyHostToDevice),
             "cudaMemcpy (prob_sums)");
  load_balancing_kernel<<<blocks_for(n_experts, kThreads), kThreads>>>(
      d_counts, d_sums, probs, index, n_tokens, n_experts, top_k);
  check_launch("load_balancing_accumulate");
  check_cuda(cudaMemcpy(counts, d_counts, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (counts)");
  check_cuda(cudaMemcpy(prob_sums, d_sums, bytes, cudaMemcpyDeviceToHost),
             "cudaMemcpy (prob_sums)");
}

void load_balancing_grad(float* dprobs, const double* counts, int64_t n_experts, int64_t rows,
                         double scale) {
  if (n_experts <= 0) return;
  // E values from E host statistics: the CPU's function, then one copy.
  std::vector<float> host(static_cast<size_t>(n_experts));
  titan::load_balancing_grad(host.data(), counts, n_experts, rows, scale);
  check_cuda(cudaMemcpy(dprobs, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
             "cudaMemcpy (load-balancing gradient)");
}

}  // namespace titan::cuda_ops
