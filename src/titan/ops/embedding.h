// Token embedding lookup and its scatter-add backward.
#pragma once

#include <cstdint>

#include "titan/ops/vocab_shard.h"

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

// Vocabulary-parallel (tensor parallel; torchtitan's RowwiseParallel on the embedding): weight
// holds the shard's rows (shard.rows, d). out (N, d) = the row of ids[n] where it falls in the
// shard, zeros elsewhere; ids are checked against the whole vocabulary [0, shard.total). Every
// id falls in one rank's shard, so the group's sum of the outputs is the whole lookup: the
// caller sums them (an all-reduce, or a reduce-scatter over the sequence under sequence
// parallel). The shard's reductions are not called.
void embedding_forward_vocab_parallel(float* out, const int32_t* ids, const float* weight,
                                      int64_t n_tokens, const VocabShard& shard, int64_t dim);
// dweight (shard.rows, d) += scatter of dout (N, d) by the ids in the shard; dout is the whole
// output's gradient, the same on every rank (all-gathered first under sequence parallel).
void embedding_backward_vocab_parallel(float* dweight, const float* dout, const int32_t* ids,
                                       int64_t n_tokens, const VocabShard& shard, int64_t dim);

}  // namespace titan
