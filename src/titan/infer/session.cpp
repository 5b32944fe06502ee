#include "titan/infer/session.h"

#include "titan/backend/cpu/vec.h"
#include "titan/core/error.h"
#include "titan/ops/linear.h"

namespace titan {

InferenceSession::InferenceSession(const Qwen3Model& model, int64_t max_len, int64_t max_chunk)
    : model_(model),
      cache_(model.args(), max_len),
      rope_(rope_cache_build(model.args(), max_len)),
      max_chunk_(max_chunk),
      positions_(static_cast<size_t>(max_chunk)) {
  const ModelArgs& a = model.args();
  TITAN_CHECK(max_chunk >= 1 && max_chunk <= max_len, "inference chunk of ", max_chunk,
              " tokens must be in [1, cache length ", max_len, "]");
  const int64_t n = max_chunk, h = a.hidden_size, qd = a.num_attention_heads * a.head_dim;
  const int64_t I = a.intermediate_size;
  const int64_t E = a.num_experts, k = a.num_experts_per_tok, Im = a.moe_intermediate_size;
  const int64_t rows = n * k;  // routed (token, slot) pairs; 0 for a dense model
  // Sizes in take() order; each view starts 64-byte aligned.
  const int64_t sizes[] = {n * h,
                           n * h,
                           n * h,
                           n * a.num_attention_heads,
                           n * qd,
                           n * qd,
                           a.num_attention_heads * n,
                           n * I,
                           n * I,
                           n * I,
                           n * E,
                           n * E,
                           n * k,
                           n * k,
                           rows * Im,
                           rows * Im,
                           rows * Im,
                           rows,
                           E + 1,
                           rows * h,
                           rows * h,
                           a.vocab_size};
  int64_t total = 0;
  for (int64_t s : sizes) total += (s + 15) / 16 * 16;
  scratch_ = Buffer(static_cast<size_t>(total) * sizeof(float), MemCategory::activations);
  float* next = scratch_.as<float>();
  const auto take = [&](int64_t count) {
    float* p = next;
    next += (count + 15) / 16 * 16;
    return p;
  };
  resid_ = take(n * h);
  norm_ = take(n * h);
  mid_ = take(n * h);
  rstd_ = take(n * a.num_attention_heads);
  attn_ = {take(n * qd), take(n * qd), rstd_, take(a.num_attention_heads * n)};
  mlp_ = {take(n * I), take(n * I), take(n * I)};
  const auto take_ints = [&](int64_t count) { return reinterpret_cast<int32_t*>(take(count)); };
  moe_.router_logits = take(n * E);
  moe_.router_probs = take(n * E);
  moe_.topk_index = take_ints(n * k);
  moe_.topk_weight = take(n * k);
  moe_.experts = {take(rows * Im), take(rows * Im), take(rows * Im), take_ints(rows),
                  take_ints(E + 1)};
  moe_scratch_.x = take(rows * h);  // the forward uses only the gathered rows
  moe_scratch_.y = take(rows * h);
  logits_ = take(a.vocab_size);
}

float* InferenceSession::forward(const int32_t* ids, int64_t n) {
  const ModelArgs& a = model_.args();
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
  const VecKernels& v = vec();
  model_.embed_tokens().forward(resid_, ids, n);
  const std::vector<DecoderLayer>& layers = model_.layers();
  for (size_t l = 0; l < layers.size(); ++l) {
    const DecoderLayer& layer = layers[l];
    const int64_t li = static_cast<int64_t>(l);
    layer.input_layernorm.forward(norm_, rstd_, resid_, n);
    layer.self_attn.forward_cached(mid_, attn_, norm_, positions_.data(), rope_, cache_.keys(li),
                                   cache_.values(li), past, n);
    v.axpy(mid_, 1.0f, resid_, n * h);
    layer.post_attention_layernorm.forward(norm_, rstd_, mid_, n);
    // The layer's input is no longer needed.
    if (layer.sparse) {
      layer.moe.forward(resid_, moe_, moe_scratch_, norm_, n);
    } else {
      layer.mlp.forward(resid_, mlp_, norm_, n);
    }
    v.axpy(resid_, 1.0f, mid_, n * h);
  }
  cache_.advance(n);
  const float* last = resid_ + (n - 1) * h;
  model_.final_norm().forward(norm_, rstd_, last, 1);
  linear_forward(logits_, norm_, model_.lm_head_weight(), 1, h, a.vocab_size);
  return logits_;
}

}  // namespace titan
