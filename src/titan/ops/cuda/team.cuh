// The device side of the row bodies' team (hd.h): a thread block, its reductions through warp
// shuffles and one shared slot per warp, summed in warp order by every thread (deterministic);
// and what every .cu file of this folder launches with.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "titan/core/error.h"
#include "titan/ops/cuda/hd.h"

namespace titan::cuda_rows {

// Threads per block of the row kernels: a multiple of the warp, as BlockTeam's shuffles need.
constexpr int kRowThreads = 256;

struct BlockTeam {
  __device__ int rank() const { return static_cast<int>(threadIdx.x); }
  __device__ int size() const { return static_cast<int>(blockDim.x); }
  __device__ void sync() const { __syncthreads(); }
  __device__ float sum(float v) const {
    return reduce(v, [](float a, float b) { return a + b; });
  }
  __device__ double sum(double v) const {
    return reduce(v, [](double a, double b) { return a + b; });
  }
  __device__ float max(float v) const {
    return reduce(v, [](float a, float b) { return fmaxf(a, b); });
  }

 private:
  template <typename T, typename Op>
  __device__ T reduce(T v, Op op) const {
    __shared__ T part[32];
    for (int offset = 16; offset > 0; offset /= 2)
      v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
    // The barrier first: a previous reduction's readers may still be reading `part`.
    __syncthreads();
    if (threadIdx.x % 32 == 0) part[threadIdx.x / 32] = v;
    __syncthreads();
    T total = part[0];
    for (unsigned w = 1; w < blockDim.x / 32; ++w) total = op(total, part[w]);
    return total;
  }
};

}  // namespace titan::cuda_rows

namespace titan::cuda_ops {

inline void check_launch(const char* kernel) {
  const cudaError_t status = cudaGetLastError();
  TITAN_CHECK(status == cudaSuccess, "CUDA kernel ", kernel,
              " failed to launch: ", cudaGetErrorString(status));
}

// Blocks of `threads` covering n elements (n > 0).
inline unsigned blocks_for(int64_t n, int threads) {
  const int64_t blocks = (n + threads - 1) / threads;
  TITAN_CHECK(blocks <= 0x7fffffff, "CUDA launch over ", n, " elements needs too many blocks");
  return static_cast<unsigned>(blocks);
}

// The first i in [0, n) with ids[i] (device memory) outside [lo, hi), or -1; *value the id
// there. Reads the answer back, so it waits for the stream.
int64_t first_id_outside(const int32_t* ids, int64_t n, int64_t lo, int64_t hi, int32_t* value);

}  // namespace titan::cuda_ops
