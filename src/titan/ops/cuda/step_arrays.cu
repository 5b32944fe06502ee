// DeviceOps' step-wide work on CUDA (dispatch/device_ops.h: sum_squares_all, adamw_step_all,
// round_to_bf16_all): one launch over every parameter array of a step (or every bf16 copy of a
// unit) instead of one per array, the arrays' pointers, sizes and flat starts uploaded as one table
// in device memory per call. The sum of squares runs
// arrays.cu's blocks for each array at once (grid y = the array), each block's fp64 sum added on
// the host array by array in block order: the same bits as sum_squares_f64 called per array, in
// one read-back. AdamW runs one thread per element of the arrays laid end to end, clipping's
// coefficient applied to each gradient as it is read (the gradients stay unscaled); the bf16 casts
// likewise one thread per element, each rounded as round_to_bf16 rounds it.
#include <cuda_runtime.h>

#include <cstring>
#include <span>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/step_arrays_rows.h"
#include "titan/ops/cuda/team.cuh"

namespace titan::cuda_ops {
namespace {

using cuda_rows::BlockTeam;

constexpr int kThreads = 256;
// Blocks per array of the fp64 sum: arrays.cu's kSumBlocks, so each array's block sums are the ones
// sum_squares_f64 adds.
constexpr int kSumBlocks = 1024;
// CUDA's limit on gridDim.y.
constexpr int64_t kMaxArrays = 65535;

void check_cuda(cudaError_t status, const char* what) {
  TITAN_CHECK(status == cudaSuccess, "CUDA ", what, " failed: ", cudaGetErrorString(status));
}

// The arrays (count; AdamWArrays or Bf16Cast, each with its size n) and their flat starts
// (count + 1) in one device Buffer.
template <typename Array>
class ArraysTable {
 public:
  explicit ArraysTable(std::span<const Array> arrays)
      : count_(static_cast<int64_t>(arrays.size())),
        table_(backend().memory(),
               sizeof(Array) * arrays.size() + sizeof(int64_t) * (arrays.size() + 1),
               MemCategory::other) {
    std::vector<unsigned char> host(table_.bytes());
    std::memcpy(host.data(), arrays.data(), sizeof(Array) * arrays.size());
    std::vector<int64_t> starts(arrays.size() + 1, 0);
    for (size_t j = 0; j < arrays.size(); ++j) starts[j + 1] = starts[j] + arrays[j].n;
    total_ = starts.back();
    std::memcpy(host.data() + sizeof(Array) * arrays.size(), starts.data(),
                sizeof(int64_t) * starts.size());
    check_cuda(cudaMemcpy(table_.data(), host.data(), host.size(), cudaMemcpyHostToDevice),
               "cudaMemcpy (arrays table)");
  }
  const Array* table() const { return table_.as<Array>(); }
  const int64_t* starts() const {
    return reinterpret_cast<const int64_t*>(table_.as<unsigned char>() + sizeof(Array) * count_);
  }
  int64_t count() const { return count_; }
  int64_t total() const { return total_; }

 private:
  int64_t count_ = 0, total_ = 0;
  Buffer table_;
};

__global__ void sum_squares_all_kernel(double* block_sums, const AdamWArrays* table) {
  const AdamWArrays& a = table[blockIdx.y];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const double part = cuda_rows::sum_squares_share(a.grad, a.n, first,
                                                   static_cast<int64_t>(gridDim.x) * blockDim.x);
  const double total = BlockTeam{}.sum(part);
  if (threadIdx.x == 0)
    block_sums[static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = total;
}

__global__ void adamw_all_kernel(const AdamWArrays* table, const int64_t* starts, int64_t count,
                                 int64_t total, AdamWScalars s, float grad_scale) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) cuda_rows::adamw_all_element(table, starts, count, i, s, grad_scale);
}

__global__ void round_all_kernel(const Bf16Cast* table, const int64_t* starts, int64_t count,
                                 int64_t total) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < total) cuda_rows::round_all_element(table, starts, count, i);
}

}  // namespace

double sum_squares_all(std::span<const AdamWArrays> arrays) {
  if (arrays.empty()) return 0.0;
  TITAN_CHECK(static_cast<int64_t>(arrays.size()) <= kMaxArrays, "sum_squares_all: ", arrays.size(),
              " arrays, more than one launch's ", kMaxArrays);
  const ArraysTable<AdamWArrays> table(arrays);
  Buffer block_sums(backend().memory(), sizeof(double) * kSumBlocks * arrays.size(),
                    MemCategory::other);
  const dim3 grid(kSumBlocks, static_cast<unsigned>(arrays.size()));
  sum_squares_all_kernel<<<grid, kThreads>>>(block_sums.as<double>(), table.table());
  check_launch("sum_squares_all");
  std::vector<double> host(kSumBlocks * arrays.size());
  check_cuda(cudaMemcpy(host.data(), block_sums.data(), block_sums.bytes(), cudaMemcpyDeviceToHost),
             "cudaMemcpy (sum_squares_all)");
  double sum = 0.0;
  for (size_t j = 0; j < arrays.size(); ++j) {
    double array_total = 0.0;  // sum_squares_f64's total of this array
    for (int b = 0; b < kSumBlocks; ++b) array_total += host[j * kSumBlocks + b];
    sum += array_total;
  }
  return sum;
}

void adamw_update_all(std::span<const AdamWArrays> arrays, const AdamWScalars& scalars,
                      float grad_scale) {
  const ArraysTable<AdamWArrays> table(arrays);
  if (table.total() == 0) return;
  adamw_all_kernel<<<blocks_for(table.total(), kThreads), kThreads>>>(
      table.table(), table.starts(), table.count(), table.total(), scalars, grad_scale);
  check_launch("adamw_step_all");
}

void round_to_bf16_all(std::span<const Bf16Cast> casts) {
  if (casts.empty()) return;
  const ArraysTable<Bf16Cast> table(casts);
  if (table.total() == 0) return;
  round_all_kernel<<<blocks_for(table.total(), kThreads), kThreads>>>(table.table(), table.starts(),
                                                                      table.count(), table.total());
  check_launch("round_to_bf16_all");
}

}  // namespace titan::cuda_ops
