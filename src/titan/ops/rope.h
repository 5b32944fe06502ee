// Rotary position embedding in Hugging Face's rotate_half convention (NeoX half split): dims j and
// j + hd/2 rotate together by angle pos * inv_freq[j]. Applied in place to (N, heads, hd) rows.
#pragma once

#include <cstdint>

#include "titan/core/tensor.h"
#include "titan/models/model_args.h"

namespace titan {

// cos and sin for every position below max_positions, each (max_positions, hd/2), computed as
// HF does: inv_freq and pos * inv_freq in fp32 (YaRN when configured), attention scaling applied.
struct RopeCache {
  int64_t max_positions = 0;
  int64_t half_dim = 0;
  Tensor cos;  // (P, hd/2)
  Tensor sin;  // (P, hd/2)
};
RopeCache rope_cache_build(const ModelArgs& args, int64_t max_positions);

// x (N, heads, hd) rotated in place by the angles of positions (N).
void rope_forward(float* x, const int32_t* positions, const RopeCache& cache, int64_t n_tokens,
                  int64_t n_heads);
// The transpose rotation: dx = R(pos)^T dy, in place on dy (N, heads, hd).
void rope_backward(float* dx, const int32_t* positions, const RopeCache& cache, int64_t n_tokens,
                   int64_t n_heads);

// Reference: HF's formula x*cos + rotate_half(x)*sin with cos/sin recomputed per element in fp64.
void rope_forward_reference(float* x, const int32_t* positions, const ModelArgs& args,
                            int64_t n_tokens, int64_t n_heads);

}  // namespace titan
