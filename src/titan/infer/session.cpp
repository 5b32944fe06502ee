#include "titan/infer/session.h"

#include <algorithm>

#include "titan/backend/backend.h"
#include "titan/core/carver.h"
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
  const ModelArgs& a = weights.model().args();
  TITAN_CHECK(max_chunk >= 1 && max_chunk <= max_len, "inference chunk of ", max_chunk,
              " tokens must be in [1, cache length ", max_len, "]");
  const int64_t n = max_chunk, h = a.hidden_size, H = a.num_attention_heads;
  const int64_t qd = H * a.head_dim, kvd = a.num_key_value_heads * a.head_dim;
  const int64_t I = a.intermediate_size, E = a.num_experts, k = a.num_experts_per_tok;
  const int64_t Im = a.moe_intermediate_size, rows = n * k;  // rows: 0 for a dense model
  const int64_t qk = a.qk_norm ? 1 : 0;
  // bf16 weights: each GEMM's input rounded to bf16 (the widest input: h, H * hd or I); in fp32
  // too for a kernel that widens the weights.
  const int64_t widest_in = n * std::max({h, qd, I});
  const int64_t bf16_in = weights.dtype() == DType::bf16 ? widest_in : 0;
  const int64_t rounded_in = weights.widened_floats() > 0 ? widest_in : 0;
  // A bf16 cache: this call's keys and values in fp32 before they are rounded into it.
  const int64_t kv_in = kv_cache_dtype == DType::bf16 ? n * kvd : 0;
  // bf16 weights and cache: q's bits for the bf16 attention.
  const int64_t q_bits =
      kv_cache_dtype == DType::bf16 && weights.dtype() == DType::bf16 ? n * qd : 0;
  for (const DecoderLayer& layer : weights.modules().layers) {
    const SelfAttention& s = layer.self_attn;
    TITAN_CHECK(kv_cache_dtype != DType::bf16 || s.attention->forward_bf16_kv != nullptr, s.name,
                ": attention kernel '", s.attention_kernel,
                "' reads only fp32 keys and values; a bf16 KV cache needs one that reads bf16");
  }
  // One table both measures the scratch (a null base) and carves it.
  const auto carve = [&](void* base) {
    Carver c(base);
    resid_ = c.take(n * h);
    norm_ = c.take(n * h);
    rstd_ = c.take(n);
    LayerActivations& l = acts_;
    l.norm1 = c.take(n * h);
    l.norm1_rstd = c.take(n);
    l.attn.q_pre = c.take(qk * n * qd);
    l.attn.q_rstd = c.take(qk * n * H);
    l.attn.k_pre = c.take(qk * n * kvd);
    l.attn.k_rstd = c.take(qk * n * a.num_key_value_heads);
    l.attn.q = c.take(n * qd);
    l.attn.k = c.take(kv_in);
    l.attn.v = c.take(kv_in);
    l.attn.out = c.take(n * qd);
    l.attn.q_bf16 = c.take<uint16_t>(q_bits);
    l.attn.lse = c.take(H * n);
    l.resid_mid = c.take(n * h);
    l.norm2 = c.take(n * h);
    l.norm2_rstd = l.norm1_rstd;  // neither row scale is read again
    l.mlp = {c.take(n * I), c.take(n * I), c.take(n * I)};
    l.moe.router_logits = c.take(n * E);
    l.moe.router_probs = c.take(n * E);
    l.moe.topk_index = c.take<int32_t>(n * k);
    l.moe.topk_weight = c.take(n * k);
    l.moe.experts = {c.take(rows * Im), c.take(rows * Im), c.take(rows * Im), c.take<int32_t>(rows),
                     c.take<int32_t>(E + 1)};
    // The forward uses the gathered rows; dgate and dup stay null, as no backward follows.
    moe_scratch_.x = c.take(rows * h);
    moe_scratch_.y = c.take(rows * h);
    logits_ = c.take(a.vocab_size);
    linear_.widened = c.take(weights.widened_floats());
    linear_.x_rounded = c.take(rounded_in);
    linear_.x_bf16 = c.take<uint16_t>(bf16_in);
    return c.used();
  };
  scratch_ = Buffer(backend().memory(), static_cast<size_t>(carve(nullptr)) * sizeof(float),
                    MemCategory::activations);
  carve(scratch_.data());
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
  LayerCall call;
  call.batch = 1;
  call.seq = n;
  call.positions = positions_.data();
  call.rope = &rope_;
  call.past = past;
  call.experts_scratch = &moe_scratch_;
  call.linear = linear_;
  m.embed_tokens.forward(resid_, ids, n);
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const auto layer = static_cast<int64_t>(l);
    call.kv_cache = cache_.layer(layer);
    m.layers[l].forward(resid_, acts_, resid_, call);
  }
  cache_.advance(n);
  const float* last = resid_ + (n - 1) * h;
  m.norm.forward(norm_, rstd_, last, 1);
  m.lm_head.forward(logits_, norm_, 1, linear_);
  // bf16 weights: the logits as a bf16 model returns them, and as bf16 training keeps them.
  if (m.lm_head.weight_bf16 != nullptr) {
    device_ops().round_to_bf16_keeping(logits_, nullptr, a.vocab_size);
  }
  return logits_;
}

}  // namespace titan
