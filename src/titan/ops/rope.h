// Rotary position embedding in Hugging Face's rotate_half convention (NeoX half split): dims j and
// j + hd/2 rotate together by angle pos * inv_freq[j]. Applied in place to (N, heads, hd) rows.
#pragma once

#include <cstdint>

#include <string>

#include "titan/core/allocator.h"

namespace titan {

// rope_scaling: none (default RoPE), YaRN (the variant official Qwen3 cards use) or Llama 3's
// frequency-dependent scaling.
struct RopeScaling {
  std::string type = "default";  // "default" | "yarn" | "llama3"
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double attention_factor = 0.0;  // yarn; 0: derived as 0.1 ln(factor) + 1
  double beta_fast = 32.0;        // yarn
  double beta_slow = 1.0;         // yarn
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
};

// What RoPE needs of a model: its head dim, base and scaling.
struct RopeParams {
  int64_t head_dim = 0;
  double theta = 10000.0;
  RopeScaling scaling;
};

// cos and sin for every position below max_positions, each (max_positions, hd/2), computed as
// HF does: inv_freq and pos * inv_freq in fp32 (YaRN or llama3 when configured), attention scaling
// applied.
// They live in the memory of the device whose kernels read them: the builder is a device op
// (DeviceOps::rope_cache), this one the host's.
struct RopeCache {
  int64_t max_positions = 0;
  int64_t half_dim = 0;
  Buffer table;                                           // (2, P, hd/2): cos, then sin
  const float* cos() const { return table.as<float>(); }  // (P, hd/2)
  const float* sin() const { return table.as<float>() + max_positions * half_dim; }  // (P, hd/2)
};
RopeCache rope_cache_build(const RopeParams& rope, int64_t max_positions);

// x (N, heads, hd) rotated in place by the angles of positions (N).
void rope_forward(float* x, const int32_t* positions, const RopeCache& cache, int64_t n_tokens,
                  int64_t n_heads);
// The transpose rotation: dx = R(pos)^T dy, in place on dy (N, heads, hd).
void rope_backward(float* dx, const int32_t* positions, const RopeCache& cache, int64_t n_tokens,
                   int64_t n_heads);

// Reference: HF's formula x*cos + rotate_half(x)*sin with cos/sin recomputed per element in fp64.
void rope_forward_reference(float* x, const int32_t* positions, const RopeParams& rope,
                            int64_t n_tokens, int64_t n_heads);

}  // namespace titan
