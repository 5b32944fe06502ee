// RMSNorm on CUDA: one block per row (norm_rows.h's bodies); dweight one thread per column over
// the rows in order, before dx (which may alias dout) is written.
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/norm_rows.h"
#include "titan/ops/cuda/team.cuh"

namespace titan::cuda_ops {
namespace {

using cuda_rows::BlockTeam;

__global__ void rms_norm_forward_kernel(float* out, float* rstd, const float* x,
                                        const float* weight, int64_t dim, float eps) {
  const int64_t r = blockIdx.x;
  cuda_rows::rms_norm_row_forward(BlockTeam{}, out + r * dim, rstd + r, x + r * dim, weight, dim,
                                  eps);
}

__global__ void rms_norm_backward_kernel(float* dx, const float* dout, const float* x,
                                         const float* weight, const float* rstd, int64_t dim) {
  const int64_t r = blockIdx.x;
  cuda_rows::rms_norm_row_backward(BlockTeam{}, dx + r * dim, dout + r * dim, x + r * dim, weight,
                                   rstd[r], dim);
}

__global__ void rms_norm_dweight_kernel(float* dweight, const float* dout, const float* x,
                                        const float* rstd, int64_t rows, int64_t dim) {
  const int64_t col = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col < dim) cuda_rows::rms_norm_dweight_column(dweight, dout, x, rstd, rows, dim, col);
}

void check_rows(int64_t rows, int64_t dim) {
  TITAN_CHECK(rows >= 0 && rows <= 0x7fffffff && dim > 0, "CUDA rms_norm: bad sizes (rows ", rows,
              ", dim ", dim, ")");
}

}  // namespace

void rms_norm_forward(float* out, float* rstd, const float* x, const float* weight, int64_t rows,
                      int64_t dim, float eps) {
  check_rows(rows, dim);
  if (rows == 0) return;
  rms_norm_forward_kernel<<<static_cast<unsigned>(rows), cuda_rows::kRowThreads>>>(
      out, rstd, x, weight, dim, eps);
  check_launch("rms_norm_forward");
}

void rms_norm_backward(float* dx, float* dweight, const float* dout, const float* x,
                       const float* weight, const float* rstd, int64_t rows, int64_t dim) {
  check_rows(rows, dim);
  if (rows == 0) return;
  if (dweight != nullptr) {
    rms_norm_dweight_kernel<<<blocks_for(dim, cuda_rows::kRowThreads), cuda_rows::kRowThreads>>>(
        dweight, dout, x, rstd, rows, dim);
    check_launch("rms_norm_backward (dweight)");
  }
  rms_norm_backward_kernel<<<static_cast<unsigned>(rows), cuda_rows::kRowThreads>>>(
      dx, dout, x, weight, rstd, dim);
  check_launch("rms_norm_backward");
}

}  // namespace titan::cuda_ops
