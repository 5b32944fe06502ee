// Causal grouped-query attention, softmax(q k^T / sqrt(hd)) v, with query head n reading kv head
// n / (H / KV) (HF repeat_kv). Queries are the last seq_q positions of seq_kv keys, so training
// (seq_q == seq_kv) and decoding against a cache share one kernel.
//
// Layouts, row-major and contiguous:
//   q, out, dq, dout  (B, Sq, H, hd)     -- straight from the q projection, no transpose
//   k, v, dk, dv      (B, Skv, KV, hd)
//   lse               (B, H, Sq)         -- log-sum-exp of each query's scores, for the backward
#pragma once

#include <cstdint>

namespace titan {

struct AttentionShape {
  int64_t batch = 0;
  int64_t seq_q = 0;
  int64_t seq_kv = 0;
  int64_t n_heads = 0;
  int64_t n_kv_heads = 0;
  int64_t head_dim = 0;
  // Packed rows (several sequences, e.g. conversations, one after another in a row): per row and
  // query, (B, Sq), the position of the first key it may see -- the start of its own sequence --
  // so attention stays inside each sequence (segment-aware causal: key j is visible to query i
  // when segment_start[i] <= j <= i). Non-decreasing along a row, each <= its own position; only
  // with Sq == Skv (training). Null: every earlier key is visible (plain causal, the same bits as
  // before segments existed).
  const int32_t* segment_start = nullptr;
};

// Throws titan::Error unless the shape is consistent (positive sizes, KV divides H, Sq <= Skv;
// segment starts as AttentionShape::segment_start says).
void attention_check_shape(const AttentionShape& s);

// Flash-attention style: key blocks streamed through an online softmax; memory O(block^2) per
// thread, never (Sq, Skv). One query (Sq == 1, a decode step) takes a dot-product path instead.
void attention_forward_blockwise(float* out, float* lse, const float* q, const float* k,
                                 const float* v, const AttentionShape& s);
// The same over keys and values in bf16 (raw bits: a bf16 KV cache), widened exactly to fp32 as
// they are read, so it computes what attention_forward_blockwise computes on the widened values.
// The one-query path reads the bf16 rows in registers (half the bytes of an fp32 cache); the
// blockwise path widens each key block's keys and values once per query block before its GEMMs.
void attention_forward_blockwise_bf16_kv(float* out, float* lse, const float* q, const uint16_t* k,
                                         const uint16_t* v, const AttentionShape& s);
// The same over q, k and v in bf16 (raw bits: mixed-precision training's roundings), its two
// GEMMs in bf16 with fp32 accumulation as PyTorch's CPU flash attention computes under autocast:
// scores, softmax and row sums in fp32, each key block's probabilities exp(score - running max)
// rounded to bf16 for P V. Blockwise for one query too (training has no decode step).
void attention_forward_blockwise_bf16(float* out, float* lse, const uint16_t* q, const uint16_t* k,
                                      const uint16_t* v, const AttentionShape& s);
// FlashAttention-2 backward: recomputes each probability block from lse. dq, dk, dv overwritten.
void attention_backward_blockwise(float* dq, float* dk, float* dv, const float* dout,
                                  const float* q, const float* k, const float* v, const float* out,
                                  const float* lse, const AttentionShape& s);

// The same over q, k, v and out in bf16 (raw bits: mixed-precision training's kept roundings), its
// GEMMs in bf16 with fp32 accumulation as PyTorch's CPU flash attention computes under autocast:
// dout is rounded to bf16 for them, and so is each block's recomputed P (for dv) and dS (for dq
// and dk), each computed in fp32 first; the softmax and its row term delta = dout . out (dout
// unrounded, out widened) stay fp32.
void attention_backward_blockwise_bf16(float* dq, float* dk, float* dv, const float* dout,
                                       const uint16_t* q, const uint16_t* k, const uint16_t* v,
                                       const uint16_t* out, const float* lse,
                                       const AttentionShape& s);
// Reference: the full (Sq, Skv) probability matrix per head, fp64 sums. For tests and the
// `reference` attention backend on small inputs.
void attention_forward_reference(float* out, float* lse, const float* q, const float* k,
                                 const float* v, const AttentionShape& s);
// The reference on k and v widened from bf16 (whole copies).
void attention_forward_reference_bf16_kv(float* out, float* lse, const float* q, const uint16_t* k,
                                         const uint16_t* v, const AttentionShape& s);
void attention_backward_reference(float* dq, float* dk, float* dv, const float* dout,
                                  const float* q, const float* k, const float* v, const float* out,
                                  const float* lse, const AttentionShape& s);

}  // namespace titan
