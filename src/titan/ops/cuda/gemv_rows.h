// The decode GEMV's row body (ops/gemv.h's contract): y[r] = W[r] . x over one weight row, split
// over a team -- on the device a warp (gemv.cu), on the host one thread or the test's threads. A
// member takes the row's 8-element chunks rank, rank + size, ... (one 16-byte load of bf16, two of
// fp32, on the device), then the elements past the last whole chunk the same way, and the team sums
// the parts. A bf16 weight multiplies x rounded to bf16, as the CPU's gemv and the bf16 GEMMs take
// their operands; accumulation is fp32 (the CPU's summation order differs: the results agree to
// fp32 rounding of a cols-long sum, not bit for bit).
#pragma once

#include <cstdint>
#include <cstring>

#include "titan/ops/cuda/hd.h"

namespace titan::cuda_rows {

constexpr int64_t kGemvChunk = 8;  // elements per member per step: 16 bytes of bf16

// 8 weights from `w` (a chunk's start) widened to fp32. On the device the caller guarantees the
// 16-byte (bf16) or 32-byte (fp32) alignment of every chunk (gemv.cu's vector path).
TITAN_HD inline void load_chunk(const uint16_t* w, float* out) {
  uint16_t bits[kGemvChunk];
#if defined(__CUDA_ARCH__)
  *reinterpret_cast<uint4*>(bits) = *reinterpret_cast<const uint4*>(w);
#else
  std::memcpy(bits, w, sizeof(bits));
#endif
  for (int64_t i = 0; i < kGemvChunk; ++i) out[i] = from_bf16(bits[i]);
}
TITAN_HD inline void load_chunk(const float* w, float* out) {
#if defined(__CUDA_ARCH__)
  reinterpret_cast<float4*>(out)[0] = reinterpret_cast<const float4*>(w)[0];
  reinterpret_cast<float4*>(out)[1] = reinterpret_cast<const float4*>(w)[1];
#else
  std::memcpy(out, w, sizeof(float) * kGemvChunk);
#endif
}
TITAN_HD inline float load_weight(const uint16_t* w) {
  return from_bf16(*w);
}
TITAN_HD inline float load_weight(const float* w) {
  return *w;
}
// x as the product with a weight of type W takes it: rounded to bf16 for a bf16 weight.
template <typename W>
TITAN_HD inline float gemv_operand(float x) {
  if constexpr (sizeof(W) == sizeof(uint16_t)) {
    return from_bf16(to_bf16(x));
  } else {
    return x;
  }
}

// W[row] (cols) . x (cols), W of type float or uint16_t (bf16 bits); every member gets the sum.
// `chunked`: read whole chunks as vectors (the device's path when the row's start is aligned);
// false reads every element singly, the same products in the same member's order of elements.
template <typename W, typename Team>
TITAN_HD float gemv_row(const Team& team, const W* w_row, const float* x, int64_t cols,
                        bool chunked) {
  float part = 0.0f;
  const int64_t chunks = chunked ? cols / kGemvChunk : 0;
  for (int64_t c = team.rank(); c < chunks; c += team.size()) {
    float wc[kGemvChunk];
    load_chunk(w_row + c * kGemvChunk, wc);
    for (int64_t i = 0; i < kGemvChunk; ++i) {
      part += wc[i] * gemv_operand<W>(x[c * kGemvChunk + i]);
    }
  }
  for (int64_t i = chunks * kGemvChunk + team.rank(); i < cols; i += team.size()) {
    part += load_weight(w_row + i) * gemv_operand<W>(x[i]);
  }
  return team.sum(part);
}

}  // namespace titan::cuda_rows
