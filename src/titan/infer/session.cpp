#include "titan/infer/session.h"

#include <algorithm>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/dispatch/device_ops.h"

namespace titan {

InferenceSession::InferenceSession(const InferenceWeights& weights, int64_t max_len,
                                   int64_t max_chunk, DType kv_cache_dtype)
    : weights_(weights),
      cache_(weights.model().args(), max_len, kv_cache_dtype),
      rope_(device_ops().rope_cache(weights.model().args().rope(), max_len)),
      max_chunk_(max_chunk),
      positions_(static_cast<size_t>(max_chunk)) {
  TITAN_CHECK(max_chunk >= 1 && max_chunk <= max_len, "inference chunk of ", max_chunk,
              " tokens must be in [1, cache length ", max_len, "]");
  for (const DecoderLayer& layer : weights.modules().layers) {
    const SelfAttention& s = layer.self_attn;
    TITAN_CHECK(kv_cache_dtype != DType::bf16 || s.attention->forward_bf16_kv != nullptr, s.name,
                ": attention kernel '", s.attention_kernel,
                "' reads only fp32 keys and values; a bf16 KV cache needs one that reads bf16");
  }
  if (&backend().memory() != &host_memory()) {
    token_rows_ = Buffer(backend().memory(), 2 * static_cast<size_t>(max_chunk) * sizeof(int32_t),
                         MemCategory::activations);
    host_logits_.resize(static_cast<size_t>(weights.model().args().vocab_size));
  }
  const InferenceShape shape{max_chunk, weights.dtype(), kv_cache_dtype};
  const CausalLM& model = weights.model();
  scratch_ =
      Buffer(backend().memory(),
             static_cast<size_t>(model.carve_inference(shape, nullptr, views_)) * sizeof(float),
             MemCategory::activations);
  model.carve_inference(shape, scratch_.data(), views_);
}

float* InferenceSession::forward(const int32_t* ids, int64_t n) {
  const ModelArgs& a = weights_.model().args();
  const DecoderModules& m = weights_.modules();
  TITAN_CHECK(n >= 1 && n <= max_chunk_, "inference call of ", n,
              " tokens; this session takes 1 to ", max_chunk_);
  const int64_t past = cache_.length(), h = a.hidden_size;
  TITAN_CHECK(past + n <= cache_.max_len(), "KV cache overflow: ", past, " + ", n,
              " tokens exceed its ", cache_.max_len(), " positions");
  for (int64_t i = 0; i < n; ++i) {
    TITAN_CHECK(ids[i] >= 0 && ids[i] < a.vocab_size, "token id ", ids[i],
                " is outside the model's vocabulary of ", a.vocab_size);
    positions_[i] = static_cast<int32_t>(past + i);
  }
  // Where the kernels read the ids and positions: in place on the CPU, else copied in.
  const int32_t* kernel_ids = ids;
  const int32_t* kernel_positions = positions_.data();
  if (token_rows_.data() != nullptr) {
    int32_t* device_ids = token_rows_.as<int32_t>();
    int32_t* device_positions = device_ids + max_chunk_;
    backend().copy_from_host(device_ids, ids, static_cast<size_t>(n) * sizeof(int32_t));
    backend().copy_from_host(device_positions, positions_.data(),
                             static_cast<size_t>(n) * sizeof(int32_t));
    kernel_ids = device_ids;
    kernel_positions = device_positions;
  }
  LayerCall call;
  call.batch = 1;
  call.seq = n;
  call.positions = kernel_positions;
  call.rope = &rope_;
  call.past = past;
  call.experts_scratch = &views_.experts;
  call.linear = views_.linear;
  float* resid = views_.resid;
  m.embed_tokens.forward(resid, kernel_ids, n);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const auto layer = static_cast<int64_t>(l);
    call.kv_cache = cache_.layer(layer);
    m.layers[l].forward(resid, views_.layer, resid, call);
  }
  cache_.advance(n);
  const float* last = resid + (n - 1) * h;
  m.norm.forward(views_.norm, views_.rstd, last, 1);
  m.lm_head.forward(views_.logits, views_.norm, 1, views_.linear);
  // bf16 weights: the logits as a bf16 model returns them, and as bf16 training keeps them.
  if (m.lm_head.weight_bf16 != nullptr) {
    device_ops().round_to_bf16_keeping(views_.logits, nullptr, a.vocab_size);
  }
  if (host_logits_.empty()) return views_.logits;
  backend().copy_to_host(host_logits_.data(), views_.logits, host_logits_.size() * sizeof(float));
  return host_logits_.data();
}

}  // namespace titan
