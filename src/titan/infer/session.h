// Inference forward of a Qwen3Model against a static KV cache: the prompt runs in one prefill
// call, then one token per call. Each call computes only what inference needs -- no loss, no
// activations kept for a backward -- and the lm_head logits of its last token only (HF's
// logits_to_keep = 1). Every buffer the session holds is allocated when it is made; a call
// allocates only what the attention kernel keeps per call (each thread's scores, a few KiB at
// decode), since the kernel interface takes no workspace yet.
//
// The linear layers read InferenceWeights (fp32 or bf16). A one-token call is a chain of GEMVs,
// bound by the bytes of weights it streams: q/k/v run as one fused GEMV, gate/up as another, so
// a layer costs five parallel regions (qkv, attention, o, gate/up, down); the one-token norms,
// RoPE and SwiGLU run on the calling thread (kMinParallelElements). A call of many tokens uses
// the GEMM, bf16 weights widened to fp32 one matrix at a time.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/infer/kv_cache.h"
#include "titan/infer/weights.h"
#include "titan/nn/qwen3.h"
#include "titan/ops/gemv.h"
#include "titan/ops/rope.h"

namespace titan {

class InferenceSession {
 public:
  // A cache of max_len positions and scratch for calls of up to max_chunk tokens. `weights`
  // (and its model) must outlive the session.
  InferenceSession(const InferenceWeights& weights, int64_t max_len, int64_t max_chunk);

  // ids (n), 1 <= n <= max_chunk, at positions [length(), length() + n): their keys and values
  // are appended to the cache. Returns the logits (V) of the last of them, valid until the next
  // call (the caller may modify them). An id outside the vocabulary or a full cache is a
  // titan::Error.
  float* forward(const int32_t* ids, int64_t n);

  int64_t length() const { return cache_.length(); }
  int64_t max_len() const { return cache_.max_len(); }
  int64_t max_chunk() const { return max_chunk_; }
  const KvCache& cache() const { return cache_; }
  const Qwen3Model& model() const { return weights_.model(); }
  const InferenceWeights& weights() const { return weights_; }
  // Keeps the first n cached positions (a shared prompt prefix); the next call continues at n.
  void truncate(int64_t n) { cache_.truncate(n); }

 private:
  // y_i (n, rows_i) = x (n, cols) W_i^T for each product (y_i of one row when n == 1).
  void project(std::initializer_list<GemvProduct> products, const float* x, int64_t n);
  // mid_ (n, h) = self-attention of layer l over norm_, appending to the cache from row `past`.
  void attention(size_t l, int64_t past, int64_t n);
  // resid_ (n, h) = the MLP of layer l over norm_.
  void mlp(size_t l, int64_t n);

  const InferenceWeights& weights_;
  KvCache cache_;
  RopeCache rope_;
  int64_t max_chunk_;
  std::vector<int32_t> positions_;  // (max_chunk)
  Buffer scratch_;
  float* resid_ = nullptr;  // (n, h) the residual stream, updated in place layer by layer
  float* norm_ = nullptr;   // (n, h)
  float* mid_ = nullptr;    // (n, h) residual after attention
  float* rstd_ = nullptr;   // (n) discarded norm scales
  float* k_pre_ = nullptr;  // (n, KV*hd) k_proj output, k_norm's input
  AttentionCachedScratch attn_;
  MlpActivations mlp_;  // dense layers
  MoeActivations moe_;  // sparse layers
  ExpertsScratch moe_scratch_;
  float* logits_ = nullptr;   // (V)
  float* widened_ = nullptr;  // (largest layer weight) bf16 widened for the GEMM; null for f32
};

}  // namespace titan
