// The decode GEMVs on CUDA (ops/gemv.h's contract): every product of one call in one launch, one
// warp per weight row over the products' rows laid end to end (gemv_rows.h's body, the warp's sum
// through shuffles), so fusing q/k/v or gate/up is one launch. A decode step is bound by the bytes
// of weights it streams: each lane reads 16 bytes of a row per step (bf16: 8 weights), a warp 512
// contiguous bytes, and a full GPU keeps thousands of warps' loads in flight.
#include <cuda_runtime.h>

#include <cstdint>

#include "titan/core/error.h"
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/gemv_rows.h"
#include "titan/ops/cuda/team.cuh"

namespace titan::cuda_ops {
namespace {

constexpr int kWarp = 32;
constexpr int kWarpsPerBlock = 8;

// A warp as gemv_row's team: lanes stride by 32, the sum through xor shuffles (every lane gets
// the same total, in the same order on every run).
struct WarpTeam {
  __device__ int rank() const { return static_cast<int>(threadIdx.x % kWarp); }
  __device__ int size() const { return kWarp; }
  __device__ float sum(float v) const {
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      v += __shfl_xor_sync(0xffffffffu, v, offset);
    }
    return v;
  }
};

// One call's products, passed by value: row r of the launch is product p's row r - first[p].
struct GemvLaunch {
  const void* w[kMaxGemvProducts];
  float* y[kMaxGemvProducts];
  int64_t first[kMaxGemvProducts + 1];  // first[p]: the launch's row of product p's row 0
  bool bf16[kMaxGemvProducts];
  bool chunked[kMaxGemvProducts];  // whole chunks as vector loads (aligned rows)
  int products;
  int64_t cols;
};

__global__ void gemv_kernel(GemvLaunch call, const float* x) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kWarpsPerBlock + threadIdx.x / kWarp;
  if (row >= call.first[call.products]) return;  // the whole warp leaves together
  int p = 0;
  while (row >= call.first[p + 1]) ++p;
  const int64_t r = row - call.first[p];
  float dot;
  if (call.bf16[p]) {
    const auto* w = static_cast<const uint16_t*>(call.w[p]) + r * call.cols;
    dot = cuda_rows::gemv_row(WarpTeam{}, w, x, call.cols, call.chunked[p]);
  } else {
    const auto* w = static_cast<const float*>(call.w[p]) + r * call.cols;
    dot = cuda_rows::gemv_row(WarpTeam{}, w, x, call.cols, call.chunked[p]);
  }
  if (threadIdx.x % kWarp == 0) call.y[p][r] = dot;
}

}  // namespace

void gemv_forward(std::span<const GemvProduct> products, const float* x) {
  TITAN_CHECK(products.size() <= kMaxGemvProducts, "CUDA gemv: ", products.size(),
              " products in one call; at most ", kMaxGemvProducts);
  if (products.empty()) return;
  GemvLaunch call{};
  call.products = static_cast<int>(products.size());
  call.cols = products[0].w.cols;
  for (size_t i = 0; i < products.size(); ++i) {
    const GemvWeight& w = products[i].w;
    TITAN_CHECK(w.dtype == DType::f32 || w.dtype == DType::bf16, "CUDA gemv: weights of dtype ",
                dtype_name(w.dtype), "; expected F32 or BF16");
    TITAN_CHECK(w.cols == call.cols, "CUDA gemv: weights of ", w.cols, " and ", call.cols,
                " columns in one call (they share x)");
    TITAN_CHECK(w.rows >= 0 && w.cols >= 0, "CUDA gemv: a weight of ", w.rows, " x ", w.cols);
    call.w[i] = w.data;
    call.y[i] = products[i].y;
    call.bf16[i] = w.dtype == DType::bf16;
    // Every row's start 16-byte aligned: the base, and a row's bytes a multiple of 16.
    call.chunked[i] =
        reinterpret_cast<uintptr_t>(w.data) % 16 == 0 && w.cols % cuda_rows::kGemvChunk == 0;
    call.first[i + 1] = call.first[i] + w.rows;
  }
  const int64_t rows = call.first[products.size()];
  if (rows == 0) return;
  const unsigned blocks = blocks_for(rows, kWarpsPerBlock);
  gemv_kernel<<<blocks, kWarp * kWarpsPerBlock>>>(call, x);
  check_launch("gemv_forward");
}

}  // namespace titan::cuda_ops
