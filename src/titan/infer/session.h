// Inference forward of a model against a static KV cache: the prompt runs in one prefill
// call, then one token per call. Each call computes only what inference needs -- no loss, no
// activations kept for a backward -- and the lm_head logits of its last token only (HF's
// logits_to_keep = 1). Every buffer the session holds is allocated when it is made; a call
// allocates only what the attention kernel keeps per call (each thread's scores, a few KiB at
// decode), since the kernel interface takes no workspace yet.
//
// On a device (titan generate --device cuda) the weights, the cache and the scratch are the
// device's memory (the backend's Buffers, as here on the CPU), each call copies its ids and
// positions in (token_rows_) and the last token's logits out, into a host row the sampler reads:
// sampling stays host code (HF's warpers, one implementation), and one row of V floats -- 0.6 MB
// for a 151,936 vocabulary, some 20-40 us over PCIe -- is small beside the step's weight bytes.
//
// Each layer is the model's own DecoderLayer::forward (nn/decoder_layer.h), the one training
// runs, with the cache in its LayerCall and every layer's activations pointing at one scratch.
// The linear layers read InferenceWeights (fp32 or bf16). A one-token call is a chain of GEMVs,
// bound by the bytes of weights it streams: q/k/v run as one fused GEMV, gate/up as another, so
// a layer costs five parallel regions (qkv, attention, o, gate/up, down); the one-token norms,
// RoPE and SwiGLU run on the calling thread (kMinParallelElements). A call of many tokens uses
// the GEMM. With bf16 weights both take bf16 operands (the tokens rounded to bf16) and
// accumulate in fp32, as mixed-precision training computes, so prefill and decode compute the
// same products.
//
// The KV cache is fp32 or bf16 (kv_cache_dtype). A bf16 cache holds each key (after k_norm and
// RoPE) and value rounded once, when its token's call writes it, and every call -- prefill and
// decode alike -- attends over the rounded rows, widened exactly: half the cache bytes a decode
// step reads, and the same attention in both.
#pragma once

#include <cstdint>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/infer/kv_cache.h"
#include "titan/infer/weights.h"
#include "titan/ops/rope.h"

namespace titan {

class InferenceSession {
 public:
  // A cache of max_len positions in kv_cache_dtype (f32 or bf16) and scratch for calls of up to
  // max_chunk tokens. `weights` (and its model) must outlive the session. A bf16 cache with an
  // attention kernel that reads only fp32 keys and values is a titan::Error.
  InferenceSession(const InferenceWeights& weights, int64_t max_len, int64_t max_chunk,
                   DType kv_cache_dtype = DType::f32);

  // ids (n), 1 <= n <= max_chunk, at positions [length(), length() + n): their keys and values
  // are appended to the cache. Returns the logits (V) of the last of them in host memory, valid
  // until the next call (the caller may modify them). An id outside the vocabulary or a full cache
  // is a titan::Error.
  float* forward(const int32_t* ids, int64_t n);

  int64_t length() const { return cache_.length(); }
  int64_t max_len() const { return cache_.max_len(); }
  int64_t max_chunk() const { return max_chunk_; }
  const KvCache& cache() const { return cache_; }
  const CausalLM& model() const { return weights_.model(); }
  const InferenceWeights& weights() const { return weights_; }
  // Keeps the first n cached positions (a shared prompt prefix); the next call continues at n.
  void truncate(int64_t n) { cache_.truncate(n); }

 private:
  const InferenceWeights& weights_;
  KvCache cache_;
  RopeCache rope_;
  int64_t max_chunk_;
  std::vector<int32_t> positions_;  // (max_chunk)
  // On a device only (empty on the CPU, whose kernels read ids, positions and logits in place):
  // the call's ids and positions, (2, max_chunk), in its memory, and the logits' host row (V).
  Buffer token_rows_;
  std::vector<float> host_logits_;
  Buffer scratch_;
  InferenceScratch views_;  // carved from scratch_ by the model's table
};

}  // namespace titan
