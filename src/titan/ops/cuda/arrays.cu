// DeviceOps' whole-array work on CUDA (dispatch/device_ops.h): adds, scales, casts, the bias and
// AdamW one thread per element (d bias one per column); the sum of squares in fp64 per block, the
// blocks' sums added on the host in block order (deterministic); searches for the first bad element
// by an atomic minimum of the index. The searches and sums read their answer back, so they wait for
// the stream.
#include <cuda_runtime.h>

#include <vector>

#include "titan/backend/backend.h"
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/elementwise_rows.h"
#include "titan/ops/cuda/team.cuh"

namespace titan::cuda_ops {
namespace {

using cuda_rows::BlockTeam;

constexpr int kThreads = 256;
// Blocks of the fp64 sum: enough to fill an H200 (132 SMs) several times over.
constexpr int kSumBlocks = 1024;
constexpr unsigned long long kNone = ~0ull;

__device__ int64_t element() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__global__ void add_kernel(float* y, const float* x, int64_t n) {
  const int64_t i = element();
  if (i < n) y[i] += x[i];
}

__global__ void scale_kernel(float* x, float a, int64_t n) {
  const int64_t i = element();
  if (i < n) x[i] *= a;
}

__global__ void sum_squares_kernel(double* block_sums, const float* x, int64_t n) {
  double part = 0.0;
  for (int64_t i = element(); i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    part += static_cast<double>(x[i]) * x[i];
  }
  const double total = BlockTeam{}.sum(part);
  if (threadIdx.x == 0) block_sums[blockIdx.x] = total;
}

__global__ void find_nonfinite_kernel(unsigned long long* first, const float* x, int64_t n) {
  const int64_t i = element();
  if (i < n && !isfinite(x[i])) atomicMin(first, static_cast<unsigned long long>(i));
}

__global__ void find_outside_kernel(unsigned long long* first, const int32_t* ids, int64_t n,
                                    int64_t lo, int64_t hi) {
  const int64_t i = element();
  if (i < n && (ids[i] < lo || ids[i] >= hi)) {
    atomicMin(first, static_cast<unsigned long long>(i));
  }
}

__global__ void round_kernel(uint16_t* dst, const float* x, int64_t n) {
  const int64_t i = element();
  if (i < n) dst[i] = cuda_rows::to_bf16(x[i]);
}

__global__ void widen_kernel(float* dst, const uint16_t* x, int64_t n) {
  const int64_t i = element();
  if (i < n) dst[i] = cuda_rows::from_bf16(x[i]);
}

__global__ void round_keeping_kernel(float* values, uint16_t* bits, int64_t n) {
  const int64_t i = element();
  if (i >= n) return;
  const uint16_t b = cuda_rows::to_bf16(values[i]);
  values[i] = cuda_rows::from_bf16(b);
  if (bits != nullptr) bits[i] = b;
}

__global__ void bias_forward_kernel(float* y, const float* bias, int64_t n, int64_t out_features) {
  const int64_t i = element();
  if (i < n) cuda_rows::bias_add_element(y, bias, out_features, i);
}

__global__ void bias_backward_kernel(float* dbias, const float* dy, int64_t rows,
                                     int64_t out_features) {
  const int64_t col = element();
  if (col < out_features) cuda_rows::bias_sum_column(dbias, dy, rows, out_features, col);
}

__global__ void adamw_kernel(float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
                             int64_t n, AdamWScalars s) {
  const int64_t i = element();
  if (i < n) cuda_rows::adamw_element(param + i, grad[i], exp_avg + i, exp_avg_sq + i, s);
}

void check_cuda(cudaError_t status, const char* what) {
  TITAN_CHECK(status == cudaSuccess, "CUDA ", what, " failed: ", cudaGetErrorString(status));
}

// An atomic-minimum slot in device memory, set to kNone, and its value read back.
class FirstIndex {
 public:
  FirstIndex() : slot_(backend().memory(), sizeof(unsigned long long), MemCategory::other) {
    check_cuda(cudaMemcpy(slot_.data(), &kNone, sizeof kNone, cudaMemcpyHostToDevice),
               "cudaMemcpy (index slot)");
  }
  unsigned long long* slot() { return slot_.as<unsigned long long>(); }
  int64_t read() const {
    unsigned long long first = kNone;
    check_cuda(cudaMemcpy(&first, slot_.data(), sizeof first, cudaMemcpyDeviceToHost),
               "cudaMemcpy (index slot)");
    return first == kNone ? -1 : static_cast<int64_t>(first);
  }

 private:
  Buffer slot_;
};

}  // namespace

void add_into(float* y, const float* x, int64_t n) {
  if (n <= 0) return;
  add_kernel<<<blocks_for(n, kThreads), kThreads>>>(y, x, n);
  check_launch("add");
}

void scale_in_place(float* x, float a, int64_t n) {
  if (n <= 0) return;
  scale_kernel<<<blocks_for(n, kThreads), kThreads>>>(x, a, n);
  check_launch("scale");
}

double sum_squares_f64(const float* x, int64_t n) {
  if (n <= 0) return 0.0;
  Buffer block_sums(backend().memory(), sizeof(double) * kSumBlocks, MemCategory::other);
  sum_squares_kernel<<<kSumBlocks, kThreads>>>(block_sums.as<double>(), x, n);
  check_launch("sum_squares");
  std::vector<double> host(kSumBlocks);
  check_cuda(cudaMemcpy(host.data(), block_sums.data(), block_sums.bytes(), cudaMemcpyDeviceToHost),
             "cudaMemcpy (sum_squares)");
  double total = 0.0;
  for (const double s : host) total += s;
  return total;
}

int64_t find_nonfinite(const float* x, int64_t n) {
  if (n <= 0) return -1;
  FirstIndex first;
  find_nonfinite_kernel<<<blocks_for(n, kThreads), kThreads>>>(first.slot(), x, n);
  check_launch("find_nonfinite");
  return first.read();
}

int64_t first_id_outside(const int32_t* ids, int64_t n, int64_t lo, int64_t hi, int32_t* value) {
  if (n <= 0) return -1;
  FirstIndex first;
  find_outside_kernel<<<blocks_for(n, kThreads), kThreads>>>(first.slot(), ids, n, lo, hi);
  check_launch("first_id_outside");
  const int64_t at = first.read();
  if (at >= 0) {
    check_cuda(cudaMemcpy(value, ids + at, sizeof(int32_t), cudaMemcpyDeviceToHost),
               "cudaMemcpy (id)");
  }
  return at;
}

void round_to_bf16(uint16_t* dst, const float* x, int64_t n) {
  if (n <= 0) return;
  round_kernel<<<blocks_for(n, kThreads), kThreads>>>(dst, x, n);
  check_launch("round_to_bf16");
}

void widen_bf16(float* dst, const uint16_t* x, int64_t n) {
  if (n <= 0) return;
  widen_kernel<<<blocks_for(n, kThreads), kThreads>>>(dst, x, n);
  check_launch("widen_bf16");
}

void round_to_bf16_keeping(float* values, uint16_t* bits, int64_t n) {
  if (n <= 0) return;
  round_keeping_kernel<<<blocks_for(n, kThreads), kThreads>>>(values, bits, n);
  check_launch("round_to_bf16_keeping");
}

void bias_forward(float* y, const float* bias, int64_t rows, int64_t out_features) {
  const int64_t n = rows * out_features;
  if (n <= 0) return;
  bias_forward_kernel<<<blocks_for(n, kThreads), kThreads>>>(y, bias, n, out_features);
  check_launch("bias_forward");
}

void bias_backward(float* dbias, const float* dy, int64_t rows, int64_t out_features) {
  if (out_features <= 0) return;
  bias_backward_kernel<<<blocks_for(out_features, kThreads), kThreads>>>(dbias, dy, rows,
                                                                         out_features);
  check_launch("bias_backward");
}

void adamw_update(float* param, const float* grad, float* exp_avg, float* exp_avg_sq, int64_t n,
                  const AdamWScalars& scalars) {
  if (n <= 0) return;
  adamw_kernel<<<blocks_for(n, kThreads), kThreads>>>(param, grad, exp_avg, exp_avg_sq, n, scalars);
  check_launch("adamw");
}

}  // namespace titan::cuda_ops
