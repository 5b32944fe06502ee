#include "titan/nn/layers.h"

#include "titan/core/error.h"

namespace titan {

const KernelEntry& KernelBinder::bind(const std::string& module, OpKind kind) const {
  for (const KernelSlot& slot : slots_) {
    if (slot.module == module && slot.kind == kind) {
      return kernel_registry().get(slot.kernel, kind);
    }
  }
  fail("module ", module, " has no ", op_kind_name(kind), " slot");
}

void Linear::forward(float* y, const float* x, int64_t n) const {
  kernel->forward(y, x, weight, n, in_features, out_features);
}

void Linear::backward(float* dx, const float* dy, const float* x, int64_t n,
                      bool accumulate_dx) const {
  kernel->backward(dx, weight_grad, dy, x, weight, n, in_features, out_features, accumulate_dx);
}

void RMSNorm::forward(float* out, float* rstd, const float* x, int64_t rows) const {
  kernel->forward(out, rstd, x, weight, rows, dim, eps);
}

void RMSNorm::backward(float* dx, const float* dout, const float* x, const float* rstd,
                       int64_t rows) const {
  kernel->backward(dx, weight_grad, dout, x, weight, rstd, rows, dim);
}

void Embedding::forward(float* out, const int32_t* ids, int64_t n) const {
  kernel->forward(out, ids, weight, n, vocab, dim);
}

void Embedding::backward(const float* dout, const int32_t* ids, int64_t n) const {
  kernel->backward(weight_grad, dout, ids, n, dim);
}

AttentionShape SelfAttention::shape(int64_t batch, int64_t seq) const {
  return {batch, seq, seq, n_heads, n_kv_heads, head_dim};
}

void SelfAttention::check_constraints(int64_t batch, int64_t seq) const {
  if (!attention->check) return;
  const std::string broken = attention->check(shape(batch, seq));
  TITAN_CHECK(broken.empty(), name, ": attention kernel '", attention_kernel, "' requires ",
              broken);
}

void SelfAttention::forward(float* y, AttentionActivations& act, const float* x,
                            const int32_t* positions, const RopeCache& rope_cache, int64_t batch,
                            int64_t seq) const {
  const int64_t n = batch * seq;
  const AttentionShape s = shape(batch, seq);
  check_constraints(batch, seq);
  q_proj.forward(act.q_pre, x, n);
  k_proj.forward(act.k_pre, x, n);
  v_proj.forward(act.v, x, n);
  q_norm.forward(act.q, act.q_rstd, act.q_pre, n * n_heads);
  k_norm.forward(act.k, act.k_rstd, act.k_pre, n * n_kv_heads);
  rope->forward(act.q, positions, rope_cache, n, n_heads);
  rope->forward(act.k, positions, rope_cache, n, n_kv_heads);
  attention->forward(act.out, act.lse, act.q, act.k, act.v, s);
  o_proj.forward(y, act.out, n);
}

void SelfAttention::attend_cached(const AttentionCachedScratch& s, const float* q_pre,
                                  const float* k_pre, const int32_t* positions,
                                  const RopeCache& rope_cache, float* k_cache, const float* v_cache,
                                  int64_t past, int64_t n) const {
  const AttentionShape shape{1, n, past + n, n_heads, n_kv_heads, head_dim};
  if (attention->check) {
    const std::string broken = attention->check(shape);
    TITAN_CHECK(broken.empty(), name, ": attention kernel '", attention_kernel, "' requires ",
                broken);
  }
  float* k_new = k_cache + past * n_kv_heads * head_dim;  // (n, KV, hd)
  q_norm.forward(s.q, s.rstd, q_pre, n * n_heads);
  k_norm.forward(k_new, s.rstd, k_pre, n * n_kv_heads);
  rope->forward(s.q, positions, rope_cache, n, n_heads);
  rope->forward(k_new, positions, rope_cache, n, n_kv_heads);
  attention->forward(s.out, s.lse, s.q, k_cache, v_cache, shape);
}

void SelfAttention::backward(float* dx, AttentionGradScratch& g, const float* dy,
                             const AttentionActivations& act, const float* x,
                             const int32_t* positions, const RopeCache& rope_cache, int64_t batch,
                             int64_t seq) const {
  const int64_t n = batch * seq;
  o_proj.backward(g.dout, dy, act.out, n, false);
  attention->backward(g.dq, g.dk, g.dv, g.dout, act.q, act.k, act.v, act.out, act.lse,
                      shape(batch, seq));
  rope->backward(g.dq, positions, rope_cache, n, n_heads);
  rope->backward(g.dk, positions, rope_cache, n, n_kv_heads);
  q_norm.backward(g.dq, g.dq, act.q_pre, act.q_rstd, n * n_heads);
  k_norm.backward(g.dk, g.dk, act.k_pre, act.k_rstd, n * n_kv_heads);
  q_proj.backward(dx, g.dq, x, n, false);
  k_proj.backward(dx, g.dk, x, n, true);
  v_proj.backward(dx, g.dv, x, n, true);
}

void SwigluMlp::forward(float* y, MlpActivations& act, const float* x, int64_t n) const {
  gate_proj.forward(act.gate, x, n);
  up_proj.forward(act.up, x, n);
  swiglu->forward(act.act, act.gate, act.up, n * intermediate);
  down_proj.forward(y, act.act, n);
}

void SwigluMlp::backward(float* dx, MlpGradScratch& g, const float* dy, const MlpActivations& act,
                         const float* x, int64_t n) const {
  down_proj.backward(g.dact, dy, act.act, n, false);
  swiglu->backward(g.dgate, g.dup, g.dact, act.gate, act.up, n * intermediate);
  gate_proj.backward(dx, g.dgate, x, n, false);
  up_proj.backward(dx, g.dup, x, n, true);
}

ExpertsShape SparseMoeBlock::shape(int64_t n) const {
  return {n, hidden, intermediate, n_experts, top_k};
}

void SparseMoeBlock::check_constraints(int64_t n) const {
  if (!experts->check) return;
  const std::string broken = experts->check(shape(n));
  TITAN_CHECK(broken.empty(), name, ".experts: experts kernel '", experts_kernel, "' requires ",
              broken);
}

void SparseMoeBlock::forward(float* y, MoeActivations& act, const ExpertsScratch& scratch,
                             const float* x, int64_t n) const {
  check_constraints(n);
  gate.forward(act.router_logits, x, n);
  router_topk_forward(act.topk_index, act.topk_weight, act.router_probs, act.router_logits, n,
                      n_experts, top_k, norm_topk_prob);
  experts->forward(y, act.experts, scratch, x, act.topk_index, act.topk_weight, weights, shape(n));
}

void SparseMoeBlock::backward(float* dx, MoeGradScratch& g, const float* dy,
                              const MoeActivations& act, const float* x, const float* dprobs_all,
                              int64_t n) const {
  experts->backward(dx, g.dweight, grads, g.experts, dy, act.experts, x, act.topk_index,
                    act.topk_weight, weights, shape(n));
  router_topk_backward(g.dlogits, g.dweight, dprobs_all, act.router_probs, act.topk_index, n,
                       n_experts, top_k, norm_topk_prob);
  gate.backward(dx, g.dlogits, x, n, true);
}

}  // namespace titan
