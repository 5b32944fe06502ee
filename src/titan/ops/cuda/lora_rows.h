// What a LoRA step adds on CUDA, one element at a time, compiled for the device and, in
// test_cuda_rows, for the host against the CPU's ops bit for bit: the dropout (ops/lora_dropout.h's
// formula, the keep/drop of each element a hash of the call's key, its global row, position and
// feature: the mask must be the CPU's for the same seed, the kept values the same products) and
// the transpose of B (ops/elementwise.h's transpose, a copy).
#pragma once

#include <cstdint>

#include "titan/ops/cuda/hd.h"

namespace titan::cuda_rows {

// core/rng.h's mix64 (SplitMix64's step and mixer), for the device too.
TITAN_HD inline uint64_t mix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// x * y rounded once, never fused with an addition that follows (nvcc contracts a * b + c into an
// FMA by default, which the CPU's separate product and sum do not round alike).
TITAN_HD inline float mul_rounded(float x, float y) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(x, y);
#else
  return x * y;
#endif
}

// The call's numbers (ops/lora_dropout.h's LoraDropoutCall, and the fp32 1 / (1 - p) the CPU
// multiplies a kept value by), passed by value to a kernel.
struct DropoutKey {
  double p;
  float scale;
  uint64_t key;
  int64_t first_row, seq_len, first_feature;
};

// Element e of an (n, features) input: dst[e] = x[e] masked and scaled, or dst[e] += that.
TITAN_HD inline void lora_dropout_element(float* dst, const float* x, int64_t features,
                                          const DropoutKey& k, bool accumulate, int64_t e) {
  const int64_t t = e / features, f = e % features;
  const uint64_t row = static_cast<uint64_t>(k.first_row + t / k.seq_len);
  const uint64_t token = mix64(mix64(k.key ^ row) ^ static_cast<uint64_t>(t % k.seq_len));
  const uint64_t bits = mix64(token ^ static_cast<uint64_t>(k.first_feature + f)) >> 11;
  const bool keeps = static_cast<double>(bits) * 0x1.0p-53 >= k.p;
  const float kept = keeps ? mul_rounded(x[e], k.scale) : 0.0f;
  dst[e] = accumulate ? dst[e] + kept : kept;
}

// Element e of dst (cols, rows) = src (rows, cols) transposed.
TITAN_HD inline void transpose_element(float* dst, const float* src, int64_t rows, int64_t cols,
                                       int64_t e) {
  const int64_t c = e / rows, r = e % rows;
  dst[e] = src[r * cols + c];
}

}  // namespace titan::cuda_rows
