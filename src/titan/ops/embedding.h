// Token embedding lookup and its scatter-add backward.
#pragma once

#include <cstdint>

namespace titan {

// out (N, d) = weight[ids[n]]; weight (V, d). Ids outside [0, V) are an error naming the position.
void embedding_forward(float* out, const int32_t* ids, const float* weight, int64_t n_tokens,
                       int64_t vocab, int64_t dim);
// The same from a bf16 weight (raw bits), each row widened exactly to fp32: inference's embedding
// held in bf16 (infer/weights.h).
void embedding_forward_bf16(float* out, const int32_t* ids, const uint16_t* weight,
                            int64_t n_tokens, int64_t vocab, int64_t dim);
// dweight (V, d) += scatter of dout (N, d) by ids.
void embedding_backward(float* dweight, const float* dout, const int32_t* ids, int64_t n_tokens,
                        int64_t dim);

}  // namespace titan
