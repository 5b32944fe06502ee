// Elementwise bodies of the CUDA kernels (one element per device thread; one loop on the host in
// tests/unit/cuda_rows_test.cpp): RoPE's rotation, SwiGLU, the embedding, the linear's bias, AdamW,
// bf16 casts.
#pragma once

#include <cmath>

#include "titan/backend/vec_kernels.h"
#include "titan/ops/cuda/hd.h"

namespace titan::cuda_rows {

// RoPE (ops/rope.h): pair `pair` of (N, heads, hd/2) pairs, dims j and j + hd/2 of its (token,
// head) row rotated by the angle of positions[token]; sin_sign -1 is the backward's transpose.
// cos and sin are the cache's (P, hd/2) tables; positions were checked against P.
TITAN_HD inline void rope_rotate_pair(float* x, const int32_t* positions, const float* cos_table,
                                      const float* sin_table, int64_t half, int64_t n_heads,
                                      int64_t pair, float sin_sign) {
  const int64_t j = pair % half, row = pair / half, token = row / n_heads;
  const int64_t at = static_cast<int64_t>(positions[token]) * half + j;
  float* x1 = x + row * 2 * half + j;
  float* x2 = x1 + half;
  const float a = *x1, b = *x2, c = cos_table[at], s = sin_sign * sin_table[at];
  *x1 = a * c - b * s;
  *x2 = b * c + a * s;
}

TITAN_HD inline float sigmoid(float z) {
  return 1.0f / (1.0f + expf(-z));
}

// SwiGLU (ops/swiglu.h): out = silu(gate) * up, and its gradients.
TITAN_HD inline float swiglu(float gate, float up) {
  return gate * sigmoid(gate) * up;
}
TITAN_HD inline void swiglu_backward_element(float* dgate, float* dup, float dout, float gate,
                                             float up) {
  const float s = sigmoid(gate);
  *dup = dout * (gate * s);
  *dgate = dout * up * s * (1.0f + gate * (1.0f - s));
}

// Embedding (ops/embedding.h): element `e` of out (N, d) = weight[ids[n]] (ids checked).
TITAN_HD inline void embedding_gather_element(float* out, const int32_t* ids, const float* weight,
                                              int64_t dim, int64_t e) {
  const int64_t n = e / dim, i = e % dim;
  out[e] = weight[static_cast<int64_t>(ids[n]) * dim + i];
}

// The same from a bf16 weight (raw bits), widened exactly: inference's bf16 embedding.
TITAN_HD inline void embedding_gather_element_bf16(float* out, const int32_t* ids,
                                                   const uint16_t* weight, int64_t dim, int64_t e) {
  const int64_t n = e / dim, i = e % dim;
  out[e] = from_bf16(weight[static_cast<int64_t>(ids[n]) * dim + i]);
}

// dweight[:, col] += dout[n, col] scattered by ids, tokens in order: one column per device
// thread, so repeated ids add in the CPU's order and the sum is deterministic.
TITAN_HD inline void embedding_scatter_column(float* dweight, const float* dout, const int32_t* ids,
                                              int64_t n_tokens, int64_t dim, int64_t col) {
  for (int64_t n = 0; n < n_tokens; ++n) {
    dweight[static_cast<int64_t>(ids[n]) * dim + col] += dout[n * dim + col];
  }
}

// The linear's bias (ops/bias.h): element `e` of y (rows, out) += bias[e % out]; and d bias's
// column `col` += the column of dy (rows, out), rows in order as the CPU's thread owning the column
// adds them (one device thread per column), so the sums are the CPU's bit for bit.
TITAN_HD inline void bias_add_element(float* y, const float* bias, int64_t out_features,
                                      int64_t e) {
  y[e] += bias[e % out_features];
}
TITAN_HD inline void bias_sum_column(float* dbias, const float* dy, int64_t rows,
                                     int64_t out_features, int64_t col) {
  float sum = dbias[col];
  for (int64_t r = 0; r < rows; ++r) sum += dy[r * out_features + col];
  dbias[col] = sum;
}

// AdamW (ops/adamw.h), PyTorch's single-tensor order as the CPU's vector kernel computes it.
TITAN_HD inline void adamw_element(float* param, float grad, float* exp_avg, float* exp_avg_sq,
                                   const AdamWScalars& s) {
  const float m = *exp_avg + (1.0f - s.beta1) * (grad - *exp_avg);
  const float v = *exp_avg_sq * s.beta2 + (1.0f - s.beta2) * grad * grad;
  *exp_avg = m;
  *exp_avg_sq = v;
  const float denom = sqrtf(v) / s.bias_correction2_sqrt + s.eps;
  *param = *param * (1.0f - s.lr * s.weight_decay) - (s.lr / s.bias_correction1) * (m / denom);
}

}  // namespace titan::cuda_rows
