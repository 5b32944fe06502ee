// RoPE on CUDA: one thread per rotated pair (elementwise_rows.h); positions checked against the
// cache first (one read back). The cache's table is built on the host as the CPU's is and copied
// into device memory, so both devices rotate by the same fp32 angles.
#include "titan/backend/backend.h"
#include "titan/ops/cuda/cuda_ops.h"
#include "titan/ops/cuda/elementwise_rows.h"
#include "titan/ops/cuda/team.cuh"

namespace titan::cuda_ops {
namespace {

__global__ void rope_kernel(float* x, const int32_t* positions, const float* cos_table,
                            const float* sin_table, int64_t half, int64_t n_heads, int64_t pairs,
                            float sin_sign) {
  const int64_t pair = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (pair < pairs) {
    cuda_rows::rope_rotate_pair(x, positions, cos_table, sin_table, half, n_heads, pair, sin_sign);
  }
}

void rotate(float* x, const int32_t* positions, const RopeCache& cache, int64_t n_tokens,
            int64_t n_heads, float sin_sign) {
  TITAN_CHECK(n_tokens >= 0 && n_heads > 0 && cache.half_dim > 0, "CUDA rope: bad sizes (tokens ",
              n_tokens, ", heads ", n_heads, ", half dim ", cache.half_dim, ")");
  if (n_tokens == 0) return;
  int32_t position = 0;
  const int64_t bad = first_id_outside(positions, n_tokens, 0, cache.max_positions, &position);
  TITAN_CHECK(bad < 0, "position ", position, " at token ", bad, " is outside the RoPE cache [0, ",
              cache.max_positions, ")");
  const int64_t pairs = n_tokens * n_heads * cache.half_dim;
  rope_kernel<<<blocks_for(pairs, 256), 256>>>(x, positions, cache.cos(), cache.sin(),
                                               cache.half_dim, n_heads, pairs, sin_sign);
  check_launch("rope");
}

}  // namespace

void rope_forward(float* x, const int32_t* positions, const RopeCache& cache, int64_t n_tokens,
                  int64_t n_heads) {
  rotate(x, positions, cache, n_tokens, n_heads, 1.0f);
}

void rope_backward(float* dx, const int32_t* positions, const RopeCache& cache, int64_t n_tokens,
                   int64_t n_heads) {
  rotate(dx, positions, cache, n_tokens, n_heads, -1.0f);
}

RopeCache rope_cache_build(const RopeParams& rope, int64_t max_positions) {
  const RopeCache host = titan::rope_cache_build(rope, max_positions);
  RopeCache cache;
  cache.max_positions = host.max_positions;
  cache.half_dim = host.half_dim;
  cache.table = Buffer(backend().memory(), host.table.bytes(), MemCategory::other);
  backend().copy_from_host(cache.table.data(), host.table.data(), host.table.bytes());
  return cache;
}

}  // namespace titan::cuda_ops
