// The experts' data movement on CUDA (ops/moe_stages.h's dispatch and combine): the plan as the
// CPU's counting sort (a count and a placement per expert thread, the offsets summed by one
// thread: the CPU's row_of and offsets exactly), the gathers and sums one thread per element of
// the (rows or tokens, h) output, each element's sum in the CPU's order (moe_rows.h).
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/moe_rows.h"
#include "titan/ops/cuda/team.cuh"

namespace titan::cuda_ops {
namespace {

constexpr int kThreads = 256;

__device__ int64_t element() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__global__ void count_kernel(int32_t* offsets, const int32_t* index, int64_t rows,
                             int64_t n_experts) {
  const int64_t e = element();
  if (e < n_experts) cuda_rows::count_expert(offsets, index, rows, e);
}

__global__ void prefix_kernel(int32_t* offsets, int64_t n_experts) {
  if (element() == 0) cuda_rows::prefix_offsets(offsets, n_experts);
}

__global__ void place_kernel(int32_t* row_of, const int32_t* offsets, const int32_t* index,
                             int64_t rows, int64_t n_experts) {
  const int64_t e = element();
  if (e < n_experts) cuda_rows::place_expert(row_of, offsets, index, rows, e);
}

__global__ void gather_kernel(float* dst, const float* src, const int32_t* row_of, int64_t top_k,
                              int64_t dim, int64_t n) {
  const int64_t i = element();
  if (i < n) cuda_rows::gather_row_element(dst, src, row_of, top_k, dim, i);
}

__global__ void gather_bf16_kernel(uint16_t* dst, const float* src, const int32_t* row_of,
                                   int64_t top_k, int64_t dim, int64_t n) {
  const int64_t i = element();
  if (i < n) cuda_rows::gather_row_element_bf16(dst, src, row_of, top_k, dim, i);
}

__global__ void sum_token_rows_kernel(float* dx, const float* dx_rows, const int32_t* row_of,
                                      int64_t top_k, int64_t hidden, int64_t n) {
  const int64_t i = element();
  if (i < n) cuda_rows::sum_token_rows_element(dx, dx_rows, row_of, top_k, hidden, i);
}

// dst[p] = src[row_of[p]] (to_rows false) or dst[row_of[p]] = src[p] (true): the rows' scalars
// between (token, slot) order and row order.
__global__ void permute_scalars_kernel(float* dst, const float* src, const int32_t* row_of,
                                       int64_t rows, bool to_rows) {
  const int64_t p = element();
  if (p >= rows) return;
  if (to_rows) {
    dst[row_of[p]] = src[p];
  } else {
    dst[p] = src[row_of[p]];
  }
}

__global__ void combine_kernel(float* y, const float* out_rows, const int32_t* row_of,
                               const int32_t* index, const float* weight, int64_t top_k,
                               int64_t hidden, int64_t n) {
  const int64_t i = element();
  if (i < n) cuda_rows::combine_element(y, out_rows, row_of, index, weight, top_k, hidden, i);
}

void gather(float* dst, const float* src, const int32_t* row_of, const ExpertsShape& shape) {
  const int64_t n = shape.rows() * shape.hidden;
  if (n <= 0) return;
  gather_kernel<<<blocks_for(n, kThreads), kThreads>>>(dst, src, row_of, shape.top_k, shape.hidden,
                                                       n);
  check_launch("moe gather");
}

void permute_scalars(float* dst, const float* src, const int32_t* row_of, int64_t rows,
                     bool to_rows) {
  if (rows <= 0) return;
  permute_scalars_kernel<<<blocks_for(rows, kThreads), kThreads>>>(dst, src, row_of, rows, to_rows);
  check_launch("moe permute_scalars");
}

}  // namespace

void moe_dispatch_plan(int32_t* row_of, int32_t* offsets, const int32_t* index,
                       const ExpertsShape& shape) {
  const int64_t E = shape.n_experts, rows = shape.rows();
  int32_t bad = 0;
  const int64_t at = first_id_outside(index, rows, 0, E, &bad);
  TITAN_CHECK(at < 0, "experts: token ", at / shape.top_k, " is routed to expert ", bad,
              ", outside [0, ", E, ")");
  count_kernel<<<blocks_for(E, kThreads), kThreads>>>(offsets, index, rows, E);
  check_launch("moe_dispatch_plan (count)");
  prefix_kernel<<<1, 1>>>(offsets, E);
  check_launch("moe_dispatch_plan (offsets)");
  place_kernel<<<blocks_for(E, kThreads), kThreads>>>(row_of, offsets, index, rows, E);
  check_launch("moe_dispatch_plan (place)");
}

void moe_dispatch_forward(float* x_rows, const float* x, const int32_t* row_of,
                          const ExpertsShape& shape) {
  gather(x_rows, x, row_of, shape);
}

void moe_dispatch_forward_bf16(uint16_t* x_rows, const float* x, const int32_t* row_of,
                               const ExpertsShape& shape) {
  const int64_t n = shape.rows() * shape.hidden;
  if (n <= 0) return;
  gather_bf16_kernel<<<blocks_for(n, kThreads), kThreads>>>(x_rows, x, row_of, shape.top_k,
                                                            shape.hidden, n);
  check_launch("moe_dispatch_forward_bf16");
}

void moe_dispatch_backward(float* dx, float* dweight, const float* dx_rows,
                           const float* dweight_rows, const int32_t* row_of,
                           const ExpertsShape& shape) {
  const int64_t n = shape.n_tokens * shape.hidden;
  if (n > 0) {
    sum_token_rows_kernel<<<blocks_for(n, kThreads), kThreads>>>(dx, dx_rows, row_of, shape.top_k,
                                                                 shape.hidden, n);
    check_launch("moe_dispatch_backward");
  }
  permute_scalars(dweight, dweight_rows, row_of, shape.rows(), false);
}

void moe_combine_forward(float* y, const float* out_rows, const int32_t* row_of,
                         const int32_t* index, const float* weight, const ExpertsShape& shape) {
  const int64_t n = shape.n_tokens * shape.hidden;
  if (n <= 0) return;
  combine_kernel<<<blocks_for(n, kThreads), kThreads>>>(y, out_rows, row_of, index, weight,
                                                        shape.top_k, shape.hidden, n);
  check_launch("moe_combine_forward");
}

void moe_combine_backward(float* dy_rows, float* w_rows, const float* dy, const float* weight,
                          const int32_t* row_of, const ExpertsShape& shape) {
  gather(dy_rows, dy, row_of, shape);
  permute_scalars(w_rows, weight, row_of, shape.rows(), true);
}

}  // namespace titan::cuda_ops
