// Inference forward of a Qwen3Model against a static KV cache: the prompt runs in one prefill
// call, then one token per call. Each call computes only what inference needs -- no loss, no
// activations kept for a backward -- and the lm_head logits of its last token only (HF's
// logits_to_keep = 1). Every buffer is allocated when the session is made; calls allocate none.
#pragma once

#include <cstdint>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/infer/kv_cache.h"
#include "titan/nn/qwen3.h"
#include "titan/ops/rope.h"

namespace titan {

class InferenceSession {
 public:
  // A cache of max_len positions and scratch for calls of up to max_chunk tokens.
  InferenceSession(const Qwen3Model& model, int64_t max_len, int64_t max_chunk);

  // ids (n), 1 <= n <= max_chunk, at positions [length(), length() + n): their keys and values
  // are appended to the cache. Returns the logits (V) of the last of them, valid until the next
  // call (the caller may modify them). An id outside the vocabulary or a full cache is a
  // titan::Error.
  float* forward(const int32_t* ids, int64_t n);

  int64_t length() const { return cache_.length(); }
  int64_t max_len() const { return cache_.max_len(); }
  int64_t max_chunk() const { return max_chunk_; }
  const KvCache& cache() const { return cache_; }
  const Qwen3Model& model() const { return model_; }
  void reset() { cache_.reset(); }

 private:
  const Qwen3Model& model_;
  KvCache cache_;
  RopeCache rope_;
  int64_t max_chunk_;
  std::vector<int32_t> positions_;  // (max_chunk)
  Buffer scratch_;
  float* resid_ = nullptr;  // (n, h) the residual stream, updated in place layer by layer
  float* norm_ = nullptr;   // (n, h)
  float* mid_ = nullptr;    // (n, h) residual after attention
  float* rstd_ = nullptr;   // (n) discarded norm scales
  AttentionCachedScratch attn_;
  MlpActivations mlp_;  // dense layers
  MoeActivations moe_;  // sparse layers
  ExpertsScratch moe_scratch_;
  float* logits_ = nullptr;  // (V)
};

}  // namespace titan
