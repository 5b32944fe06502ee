// DeviceOps' step-wide work on CUDA (dispatch/device_ops.h: sum_squares_all, adamw_step_all,
// round_to_bf16_all): one launch over up to kTableArrays parameter arrays of a step (or bf16 copies
// of a unit) instead of one per array. The arrays' pointers, sizes and flat starts travel as the
// kernel's own __grid_constant__ parameter (LaunchTable, under 2 KiB of the 4 KiB a launch takes):
// no device allocation and no synchronous copy per call, so the launches queue behind the step's
// other work. The sum of squares runs arrays.cu's blocks for each array at once (grid y = the
// array), each block's fp64 sum added on the host array by array in block order: the same bits as
// sum_squares_f64 called per array, in one read-back. AdamW runs one thread per element of the
// arrays laid end to end, clipping's coefficient applied to each gradient as it is read (the
// gradients stay unscaled); the bf16 casts likewise one thread per element, each rounded as
// round_to_bf16 rounds it.
#include <cuda_runtime.h>

#include <algorithm>
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
// Arrays per launch: a dense model's groups (one per block, the embedding, [norm, lm_head]) up to
// 30 layers in one launch, a block's bf16 copies (7) always.
constexpr int kTableArrays = 32;

void check_cuda(cudaError_t status, const char* what) {
  TITAN_CHECK(status == cudaSuccess, "CUDA ", what, " failed: ", cudaGetErrorString(status));
}

// Up to kTableArrays arrays (AdamWArrays or Bf16Cast, each with its size n), their flat starts
// (count + 1) and total: one launch's parameter.
template <typename Array>
struct LaunchTable {
  Array arrays[kTableArrays];
  int64_t starts[kTableArrays + 1];
  int64_t count, total;
};

// Calls launch(table, first) for each run of up to kTableArrays arrays, `first` the index of its
// first array in `arrays`.
template <typename Array, typename Launch>
void for_each_table(std::span<const Array> arrays, Launch launch) {
  for (size_t first = 0; first < arrays.size(); first += kTableArrays) {
    LaunchTable<Array> t{};
    t.count = static_cast<int64_t>(std::min<size_t>(kTableArrays, arrays.size() - first));
    for (int64_t j = 0; j < t.count; ++j) {
      t.arrays[j] = arrays[first + static_cast<size_t>(j)];
      t.starts[j + 1] = t.starts[j] + t.arrays[j].n;
    }
    t.total = t.starts[t.count];
    launch(t, first);
  }
}

__global__ void sum_squares_all_kernel(double* block_sums,
                                       const __grid_constant__ LaunchTable<AdamWArrays> t) {
  const AdamWArrays& a = t.arrays[blockIdx.y];
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const double part = cuda_rows::sum_squares_share(a.grad, a.n, first,
                                                   static_cast<int64_t>(gridDim.x) * blockDim.x);
  const double total = BlockTeam{}.sum(part);
  if (threadIdx.x == 0) {
    block_sums[static_cast<int64_t>(blockIdx.y) * gridDim.x + blockIdx.x] = total;
  }
}

__global__ void adamw_all_kernel(const __grid_constant__ LaunchTable<AdamWArrays> t, AdamWScalars s,
                                 float grad_scale) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < t.total) cuda_rows::adamw_all_element(t.arrays, t.starts, t.count, i, s, grad_scale);
}

__global__ void round_all_kernel(const __grid_constant__ LaunchTable<Bf16Cast> t) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < t.total) cuda_rows::round_all_element(t.arrays, t.starts, t.count, i);
}

}  // namespace

double sum_squares_all(std::span<const AdamWArrays> arrays) {
  if (arrays.empty()) return 0.0;
  Buffer block_sums(backend().memory(), sizeof(double) * kSumBlocks * arrays.size(),
                    MemCategory::other);
  for_each_table(arrays, [&](const LaunchTable<AdamWArrays>& t, size_t first) {
    const dim3 grid(kSumBlocks, static_cast<unsigned>(t.count));
    sum_squares_all_kernel<<<grid, kThreads>>>(block_sums.as<double>() + first * kSumBlocks, t);
    check_launch("sum_squares_all");
  });
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
  for_each_table(arrays, [&](const LaunchTable<AdamWArrays>& t, size_t) {
    if (t.total == 0) return;
    adamw_all_kernel<<<blocks_for(t.total, kThreads), kThreads>>>(t, scalars, grad_scale);
    check_launch("adamw_step_all");
  });
}

void round_to_bf16_all(std::span<const Bf16Cast> casts) {
  for_each_table(casts, [&](const LaunchTable<Bf16Cast>& t, size_t) {
    if (t.total == 0) return;
    round_all_kernel<<<blocks_for(t.total, kThreads), kThreads>>>(t);
    check_launch("round_to_bf16_all");
  });
}

}  // namespace titan::cuda_ops
