#include "titan/infer/session.h"

#include <algorithm>

#include "titan/backend/cpu/vec.h"
#include "titan/core/error.h"
#include "titan/io/convert.h"
#include "titan/ops/linear.h"

namespace titan {

InferenceSession::InferenceSession(const InferenceWeights& weights, int64_t max_len,
                                   int64_t max_chunk)
    : weights_(weights),
      cache_(weights.model().args(), max_len),
      rope_(rope_cache_build(weights.model().args().rope(), max_len)),
      max_chunk_(max_chunk),
      positions_(static_cast<size_t>(max_chunk)) {
  const ModelArgs& a = weights.model().args();
  TITAN_CHECK(max_chunk >= 1 && max_chunk <= max_len, "inference chunk of ", max_chunk,
              " tokens must be in [1, cache length ", max_len, "]");
  const int64_t n = max_chunk, h = a.hidden_size, qd = a.num_attention_heads * a.head_dim;
  const int64_t kvd = a.num_key_value_heads * a.head_dim, I = a.intermediate_size;
  const int64_t E = a.num_experts, k = a.num_experts_per_tok, Im = a.moe_intermediate_size;
  const int64_t rows = n * k;  // routed (token, slot) pairs; 0 for a dense model
  // Only a bf16 prefill widens weights: the largest layer matrix (the lm_head always runs as a
  // GEMV over the last token).
  const int64_t widened =
      weights.dtype() == DType::bf16 && n > 1 ? std::max({qd * h, kvd * h, I * h}) : 0;
  // Sizes in take() order; each view starts 64-byte aligned.
  const int64_t sizes[] = {n * h,     n * h,     n * h,        n * a.num_attention_heads,
                           n * kvd,   n * qd,    n * qd,       a.num_attention_heads * n,
                           n * I,     n * I,     n * I,        n * E,
                           n * E,     n * k,     n * k,        rows * Im,
                           rows * Im, rows * Im, rows,         E + 1,
                           rows * h,  rows * h,  a.vocab_size, widened};
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
  k_pre_ = take(n * kvd);
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
  widened_ = widened > 0 ? take(widened) : nullptr;
}

void InferenceSession::project(std::initializer_list<GemvProduct> products, const float* x,
                               int64_t n) {
  if (n == 1) {
    gemv_forward(products, x);
    return;
  }
  for (const GemvProduct& p : products) {
    const float* w = static_cast<const float*>(p.w.data);
    if (p.w.dtype == DType::bf16) {
      convert_to_f32(p.w.data, DType::bf16, static_cast<size_t>(p.w.rows * p.w.cols), widened_);
      w = widened_;
    }
    linear_forward(p.y, x, w, n, p.w.cols, p.w.rows);
  }
}

void InferenceSession::attention(size_t l, int64_t past, int64_t n) {
  const LayerWeights& w = weights_.layer(l);
  const SelfAttention& attn = model().layers()[l].self_attn;
  const int64_t li = static_cast<int64_t>(l), kvd = attn.n_kv_heads * attn.head_dim;
  float* v_new = cache_.values(li) + past * kvd;  // v goes straight into its cache rows
  // q before its norm goes through attn_.out, free until the attention writes it.
  project({{w.q, attn_.out}, {w.k, k_pre_}, {w.v, v_new}}, norm_, n);
  attn.attend_cached(attn_, attn_.out, k_pre_, positions_.data(), rope_, cache_.keys(li),
                     cache_.values(li), past, n);
  project({{w.o, mid_}}, attn_.out, n);
}

void InferenceSession::mlp(size_t l, int64_t n) {
  const DecoderLayer& layer = model().layers()[l];
  if (layer.sparse) {  // experts and router read the model's fp32 parameters (weights.h)
    layer.moe.forward(resid_, moe_, moe_scratch_, norm_, n);
    return;
  }
  const LayerWeights& w = weights_.layer(l);
  const SwigluMlp& mlp = layer.mlp;
  project({{w.gate, mlp_.gate}, {w.up, mlp_.up}}, norm_, n);
  mlp.swiglu->forward(mlp_.act, mlp_.gate, mlp_.up, n * mlp.intermediate);
  project({{w.down, resid_}}, mlp_.act, n);
}

float* InferenceSession::forward(const int32_t* ids, int64_t n) {
  const Qwen3Model& model = weights_.model();
  const ModelArgs& a = model.args();
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
  model.embed_tokens().forward(resid_, ids, n);
  const std::vector<DecoderLayer>& layers = model.layers();
  for (size_t l = 0; l < layers.size(); ++l) {
    const DecoderLayer& layer = layers[l];
    layer.input_layernorm.forward(norm_, rstd_, resid_, n);
    attention(l, past, n);
    v.axpy(mid_, 1.0f, resid_, n * h);
    layer.post_attention_layernorm.forward(norm_, rstd_, mid_, n);
    mlp(l, n);  // the layer's input is no longer needed
    v.axpy(resid_, 1.0f, mid_, n * h);
  }
  cache_.advance(n);
  const float* last = resid_ + (n - 1) * h;
  model.final_norm().forward(norm_, rstd_, last, 1);
  project({{weights_.lm_head(), logits_}}, norm_, 1);
  return logits_;
}

}  // namespace titan
