#include "titan/nn/layers.h"

#include <algorithm>
#include <span>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/dispatch/device_ops.h"

namespace titan {

const KernelEntry& KernelBinder::bind(const std::string& module, OpKind kind) const {
  for (const KernelSlot& slot : slots_) {
    if (slot.module == module && slot.kind == kind) {
      return kernel_registry().get(slot.kernel, kind);
    }
  }
  fail("module ", module, " has no ", op_kind_name(kind), " slot");
}

namespace {

// out (batch, degree, seq / degree, h) = every rank's rows (batch, seq / degree, h) in rank order:
// each sequence one part.
void gather_sequences(const LayerCall& call, const float* rows, float* out, int64_t h) {
  call.collectives->all_gather(rows, out, call.seq / call.sequence_shards->degree * h, call.batch);
}

}  // namespace

const float* LayerCall::gather_block_input(const float* rows, int64_t h) const {
  if (sequence_shards == nullptr) return rows;
  gather_sequences(*this, rows, sequence_shards->gathered, h);
  return sequence_shards->gathered;
}

const float* LayerCall::gather_output_grad(const float* rows, int64_t h) const {
  if (sequence_shards == nullptr) return rows;
  gather_sequences(*this, rows, sequence_shards->partial, h);
  return sequence_shards->partial;
}

void LayerCall::sum_block_output(float* out, float* partial, int64_t h) const {
  if (sequence_shards == nullptr) {
    sum_partials(out, tokens() * h);
    return;
  }
  collectives->reduce_scatter(partial, out, seq / sequence_shards->degree * h, batch);
}

void LayerCall::slice_sparse_rows(const float* whole, float* rows, int64_t h) const {
  const int64_t part = seq / sparse_shard->degree;
  for (int64_t b = 0; b < batch; ++b) {
    backend().copy_on_device(rows + b * part * h,
                             whole + (b * seq + sparse_shard->index * part) * h,
                             static_cast<size_t>(part * h) * sizeof(float));
  }
}

void LayerCall::gather_sparse_rows(const float* rows, float* whole, int64_t h) const {
  collectives->all_gather(rows, whole, seq / sparse_shard->degree * h, batch);
}

GemvWeight Linear::compute_weight() const {
  if (weight_bf16 != nullptr) return {DType::bf16, weight_bf16, out_features, in_features};
  return {DType::f32, weight, out_features, in_features};
}

bool Linear::computes_in_bf16() const {
  return weight_bf16 != nullptr && kernel->forward_bf16 != nullptr;
}

void Linear::forward(float* y, const float* x, int64_t n, const LinearScratch& scratch,
                     uint16_t* keep_x_bf16) const {
  linear_group_forward({{this, y}}, x, n, scratch, keep_x_bf16);
}

void Linear::forward_bf16(float* y, const uint16_t* x_bf16, int64_t n) const {
  TITAN_CHECK(computes_in_bf16(), name, ": an input in bf16, but it computes in fp32");
  kernel->forward_bf16(y, x_bf16, weight_bf16, n, in_features, out_features);
  if (bias != nullptr && adds_bias) device_ops().bias_forward(y, bias, n, out_features);
  if (lora != nullptr) lora->forward_add_bf16(y, x_bf16, n, *kernel);
}

bool Linear::writes_bf16() const {
  return computes_in_bf16() && kernel->forward_bf16_to_bf16 != nullptr && bias == nullptr &&
         lora == nullptr;
}

void Linear::forward_to_bf16(uint16_t* y, const uint16_t* x_bf16, int64_t n) const {
  TITAN_CHECK(writes_bf16(), name, ": asked for a bf16 output it cannot write");
  kernel->forward_bf16_to_bf16(y, x_bf16, weight_bf16, n, in_features, out_features);
}

void Linear::backward(float* dx, const float* dy, const float* x, int64_t n, bool accumulate_dx,
                      const LinearScratch& scratch, const uint16_t* x_bf16) const {
  linear_group_backward({{this, dy}}, dx, x, n, accumulate_dx, scratch, x_bf16);
}

void linear_group_backward(std::initializer_list<LinearGrad> grads, float* dx, const float* x,
                           int64_t n, bool accumulate_dx, const LinearScratch& scratch,
                           const uint16_t* x_bf16) {
  // The linears share x: it is rounded to bf16 once, unless the forward kept its rounding.
  const uint16_t* rounded = x_bf16;
  for (const LinearGrad& g : grads) {
    const Linear& l = *g.linear;
    if (l.computes_in_bf16()) {
      TITAN_CHECK(scratch.x_bf16 != nullptr && scratch.dy_bf16 != nullptr, l.name,
                  ": bf16 compute needs rounding buffers");
      if (rounded == nullptr) {
        device_ops().round_to_bf16(scratch.x_bf16, x, n * l.in_features);
        rounded = scratch.x_bf16;
      }
      const uint16_t* dy_rounded = g.dy_bf16;
      if (dy_rounded == nullptr) {
        device_ops().round_to_bf16(scratch.dy_bf16, g.dy, n * l.out_features);
        dy_rounded = scratch.dy_bf16;
      }
      l.kernel->backward_bf16(dx, l.weight_grad, dy_rounded, rounded, l.weight_bf16, n,
                              l.in_features, l.out_features, accumulate_dx);
      if (l.lora != nullptr) l.lora->backward_bf16(dx, dy_rounded, rounded, n, *l.kernel);
    } else {
      TITAN_CHECK(x_bf16 == nullptr && g.dy_bf16 == nullptr, l.name,
                  ": its input or output gradient in bf16, but it computes in fp32");
      TITAN_CHECK(l.weight_bf16 == nullptr, l.name, ": a bf16 weight, but kernel '", l.kernel_name,
                  "' has no bf16 form");
      l.kernel->backward(dx, l.weight_grad, g.dy, x, l.weight, n, l.in_features, l.out_features,
                         accumulate_dx);
      if (l.lora != nullptr) l.lora->backward(dx, g.dy, x, n, *l.kernel);
    }
    if (l.bias_grad != nullptr) {
      TITAN_CHECK(g.dy != nullptr, l.name, ": a bias gradient needs the output gradient in fp32");
      device_ops().bias_backward(l.bias_grad, g.dy, n, l.out_features);
    }
    accumulate_dx = true;
  }
}

void linear_group_forward(std::initializer_list<LinearOutput> outputs, const float* x, int64_t n,
                          const LinearScratch& scratch, uint16_t* keep_x_bf16) {
  // A kept rounding is for a backward, which the fused GEMVs (decode) never have.
  bool fused = n == 1 && outputs.size() <= kMaxGemvProducts && keep_x_bf16 == nullptr;
  // Only the device's default kernel's one-token products are the device's fused GEMVs.
  const std::string& builtin = kernel_registry().default_kernel(OpKind::linear, backend().kind());
  for (const LinearOutput& o : outputs) {
    fused = fused && o.linear->kernel_name == builtin && o.linear->lora == nullptr;
  }
  if (fused) {
    GemvProduct products[kMaxGemvProducts];
    size_t count = 0;
    for (const LinearOutput& o : outputs) products[count++] = {o.linear->compute_weight(), o.y};
    device_ops().gemv(std::span<const GemvProduct>(products, count), x);
  }
  uint16_t* rounded = nullptr;  // the linears share x: it is rounded to bf16 once
  for (const LinearOutput& o : outputs) {
    const Linear& l = *o.linear;
    TITAN_CHECK(keep_x_bf16 == nullptr || l.computes_in_bf16(), l.name,
                ": its input kept in bf16, but it computes in fp32");
    if (!fused && l.computes_in_bf16()) {
      if (rounded == nullptr) {
        rounded = keep_x_bf16 != nullptr ? keep_x_bf16 : scratch.x_bf16;
        TITAN_CHECK(rounded != nullptr, l.name, ": bf16 compute needs a rounding buffer");
        device_ops().round_to_bf16(rounded, x, n * l.in_features);
      }
      l.forward_bf16(o.y, rounded, n);  // with the bias
      continue;
    }
    if (!fused) {
      // A model computing in bf16 binds only kernels with a bf16 form (dispatch/overrides.h).
      TITAN_CHECK(l.weight_bf16 == nullptr, l.name, ": a bf16 weight, but kernel '", l.kernel_name,
                  "' has no bf16 form");
      l.kernel->forward(o.y, x, l.weight, n, l.in_features, l.out_features);
    }
    if (l.bias != nullptr && l.adds_bias) device_ops().bias_forward(o.y, l.bias, n, l.out_features);
  }
  // A bf16 linear added its update in forward_bf16, on the rounded x.
  for (const LinearOutput& o : outputs) {
    const Linear& l = *o.linear;
    if (l.lora != nullptr && !l.computes_in_bf16()) l.lora->forward_add(o.y, x, n, *l.kernel);
  }
}

void RMSNorm::forward(float* out, float* rstd, const float* x, int64_t rows) const {
  kernel->forward(out, rstd, x, weight, rows, dim, eps);
}

void RMSNorm::backward(float* dx, const float* dout, const float* x, const float* rstd,
                       int64_t rows) const {
  kernel->backward(dx, weight_grad, dout, x, weight, rstd, rows, dim);
}

void Embedding::forward(float* out, const int32_t* ids, int64_t n) const {
  if (vocab_shard != nullptr) {
    TITAN_CHECK(weight_bf16 == nullptr, name, ": a vocabulary-parallel lookup in bf16");
    kernel->forward_vocab_parallel(out, ids, weight, n, *vocab_shard, dim);
    return;
  }
  if (weight_bf16 != nullptr) {
    kernel->forward_bf16(out, ids, weight_bf16, n, vocab, dim);
  } else {
    kernel->forward(out, ids, weight, n, vocab, dim);
  }
}

void Embedding::backward(const float* dout, const int32_t* ids, int64_t n) const {
  if (weight_grad == nullptr) return;  // a frozen embedding (LoRA's base)
  if (vocab_shard != nullptr) {
    kernel->backward_vocab_parallel(weight_grad, dout, ids, n, *vocab_shard, dim);
    return;
  }
  kernel->backward(weight_grad, dout, ids, n, dim);
}

AttentionShape SelfAttention::shape(const LayerCall& call) const {
  return {call.batch, call.seq, call.past + call.seq, n_heads,
          n_kv_heads, head_dim, call.segment_start};
}

void SelfAttention::check_constraints(const AttentionShape& s) const {
  require_constraints(name, attention_kernel, *attention, s);
}

void SelfAttention::forward(float* y, AttentionActivations& act, const float* x,
                            const LayerCall& call) const {
  const int64_t n = call.tokens(), kv_row = n_kv_heads * head_dim;
  const AttentionShape s = shape(call);
  check_constraints(s);
  const KvCacheView& cache = call.kv_cache;
  const bool cached = cache.keys != nullptr;
  TITAN_CHECK(!cached || call.batch == 1, name, ": a KV cache holds one sequence, not ",
              call.batch);
  // This call's keys and values (after k_norm and RoPE): straight into an fp32 cache, else into
  // the activations (and from there rounded into a bf16 cache).
  const bool f32_cache = cached && cache.dtype == DType::f32;
  float* k = f32_cache ? static_cast<float*>(cache.keys) + call.past * kv_row : act.k;
  float* v = f32_cache ? static_cast<float*>(cache.values) + call.past * kv_row : act.v;
  linear_group_forward(
      {{&q_proj, qk_norm ? act.q_pre : act.q}, {&k_proj, qk_norm ? act.k_pre : k}, {&v_proj, v}}, x,
      n, call.linear, act.x_bf16);
  // bf16 projections (training under bf16, inference on bf16 weights) return q_pre, k_pre and v
  // rounded to bf16, and attention reads q and k rounded after RoPE, as autocast's bf16 matmuls
  // and a bf16 model have them; training keeps the roundings (act.kept) for its backward.
  const bool bf16 = q_proj.weight_bf16 != nullptr;
  TITAN_CHECK(act.kept.q == nullptr || (bf16 && !cached), name,
              ": bf16-kept activations need bf16 projections and no KV cache");
  const int64_t q_count = n * n_heads * head_dim;
  const int64_t kv_count = n * kv_row;
  // Training's attention in bf16 reads only the kept bits of q, k and v: their fp32 values (the
  // fp32 forward's operands) are not rounded in place.
  const bool bf16_forward = act.kept.q != nullptr && attention->forward_bf16 != nullptr;
  const auto round_for_attention = [&](float* values, uint16_t* bits, int64_t count) {
    if (bf16_forward) {
      device_ops().round_to_bf16(bits, values, count);
    } else {
      device_ops().round_to_bf16_keeping(values, bits, count);
    }
  };
  if (bf16) {
    if (qk_norm) {
      device_ops().round_to_bf16_keeping(act.q_pre, act.kept.q_pre, q_count);
      device_ops().round_to_bf16_keeping(act.k_pre, act.kept.k_pre, kv_count);
    }
    round_for_attention(v, act.kept.v, kv_count);
  }
  if (qk_norm) {
    q_norm.forward(act.q, act.q_rstd, act.q_pre, n * n_heads);
    k_norm.forward(k, act.k_rstd, act.k_pre, n * n_kv_heads);
  }
  rope->forward(act.q, call.positions, *call.rope, n, n_heads);
  rope->forward(k, call.positions, *call.rope, n, n_kv_heads);
  if (bf16) {
    // Inference's q bits (act.q_bf16) are written here too: kept is null with a KV cache.
    round_for_attention(act.q, act.kept.q != nullptr ? act.kept.q : act.q_bf16, q_count);
    round_for_attention(k, act.kept.k, kv_count);
  }
  if (bf16_forward) {
    attention->forward_bf16(act.out, act.lse, act.kept.q, act.kept.k, act.kept.v, s);
  } else if (!cached || f32_cache) {
    const float* k_all = cached ? static_cast<const float*>(cache.keys) : act.k;
    const float* v_all = cached ? static_cast<const float*>(cache.values) : act.v;
    attention->forward(act.out, act.lse, act.q, k_all, v_all, s);
  } else {
    TITAN_CHECK(cache.dtype == DType::bf16, name, ": a KV cache in ", dtype_name(cache.dtype),
                "; expected F32 or BF16");
    TITAN_CHECK(attention->forward_bf16_kv != nullptr, name, ": attention kernel '",
                attention_kernel, "' reads only fp32 keys and values, not a bf16 KV cache");
    auto* keys = static_cast<uint16_t*>(cache.keys);
    auto* values = static_cast<uint16_t*>(cache.values);
    device_ops().round_to_bf16(keys + call.past * kv_row, k, kv_count);
    device_ops().round_to_bf16(values + call.past * kv_row, v, kv_count);
    // A bf16 model over its bf16 cache attends in bf16, on q's bits written above: the kernel
    // rounds the probabilities for P V (a decode step too, on its one-query path).
    if (bf16 && act.q_bf16 != nullptr && attention->forward_bf16 != nullptr) {
      attention->forward_bf16(act.out, act.lse, act.q_bf16, keys, values, s);
    } else {
      attention->forward_bf16_kv(act.out, act.lse, act.q, keys, values, s);
    }
  }
  o_proj.forward(y, act.out, n, call.linear, act.kept.out);
}

void SelfAttention::backward(float* dx, AttentionGradScratch& g, const float* dy,
                             const AttentionActivations& act, const float* x,
                             const LayerCall& call) const {
  const int64_t n = call.tokens();
  const int64_t q_count = n * n_heads * head_dim;
  const int64_t kv_count = n * n_kv_heads * head_dim;
  // Kept in bf16: the norms' inputs are widened for their backward, and q, k, v and the output go
  // to the attention kernel's bf16 backward as kept, or are widened for its fp32 one.
  const bool kept = act.kept.q != nullptr;
  const bool bf16_backward = kept && attention->backward_bf16 != nullptr;
  if (kept && qk_norm) {
    device_ops().widen_bf16(act.q_pre, act.kept.q_pre, q_count);
    device_ops().widen_bf16(act.k_pre, act.kept.k_pre, kv_count);
  }
  // With q/k norms, q and k are not kept: they are made again from the norms' inputs as the
  // forward made them, bit for bit (their rstd rewritten with the same values), which costs two
  // row norms and RoPE against N x (H + KV) x hd values a layer.
  if (qk_norm) {
    q_norm.forward(act.q, act.q_rstd, act.q_pre, n * n_heads);
    k_norm.forward(act.k, act.k_rstd, act.k_pre, n * n_kv_heads);
    rope->forward(act.q, call.positions, *call.rope, n, n_heads);
    rope->forward(act.k, call.positions, *call.rope, n, n_kv_heads);
    if (bf16_backward) {
      device_ops().round_to_bf16(act.kept.q, act.q, q_count);
      device_ops().round_to_bf16(act.kept.k, act.k, kv_count);
    } else if (kept) {
      device_ops().round_to_bf16_keeping(act.q, act.kept.q, q_count);
      device_ops().round_to_bf16_keeping(act.k, act.kept.k, kv_count);
    }
  }
  if (kept) {
    if (!bf16_backward) {
      if (!qk_norm) {
        device_ops().widen_bf16(act.q, act.kept.q, q_count);
        device_ops().widen_bf16(act.k, act.kept.k, kv_count);
      }
      device_ops().widen_bf16(act.v, act.kept.v, kv_count);
      device_ops().widen_bf16(act.out, act.kept.out, q_count);
    }
  }
  o_proj.backward(g.dout, dy, act.out, n, false, call.linear, act.kept.out);
  if (bf16_backward) {
    attention->backward_bf16(g.dq, g.dk, g.dv, g.dout, act.kept.q, act.kept.k, act.kept.v,
                             act.kept.out, act.lse, shape(call));
  } else {
    attention->backward(g.dq, g.dk, g.dv, g.dout, act.q, act.k, act.v, act.out, act.lse,
                        shape(call));
  }
  rope->backward(g.dq, call.positions, *call.rope, n, n_heads);
  rope->backward(g.dk, call.positions, *call.rope, n, n_kv_heads);
  if (qk_norm) {
    q_norm.backward(g.dq, g.dq, act.q_pre, act.q_rstd, n * n_heads);
    k_norm.backward(g.dk, g.dk, act.k_pre, act.k_rstd, n * n_kv_heads);
  }
  linear_group_backward({{&q_proj, g.dq}, {&k_proj, g.dk}, {&v_proj, g.dv}}, dx, x, n, false,
                        call.linear, act.x_bf16);
}

void SwigluMlp::forward(float* y, MlpActivations& act, const float* x, int64_t n,
                        const LinearScratch& linear) const {
  const int64_t count = n * intermediate;
  // bf16 training with a swiglu kernel that has the bf16 forms: gate and up are kept rounded
  // (autocast's bf16 gate_proj/up_proj outputs), written so by the GEMMs where the kernels can,
  // and act is made from them as the backward makes it again.
  if (act.gate_bf16 != nullptr && swiglu->recompute_bf16 != nullptr) {
    if (gate_proj.writes_bf16() && up_proj.writes_bf16()) {
      device_ops().round_to_bf16(act.x_bf16, x, n * hidden);
      gate_proj.forward_to_bf16(act.gate_bf16, act.x_bf16, n);
      up_proj.forward_to_bf16(act.up_bf16, act.x_bf16, n);
    } else {
      linear_group_forward({{&gate_proj, act.gate}, {&up_proj, act.up}}, x, n, linear, act.x_bf16);
      device_ops().round_to_bf16(act.gate_bf16, act.gate, count);
      device_ops().round_to_bf16(act.up_bf16, act.up, count);
    }
    swiglu->recompute_bf16(act.act_bf16, act.gate_bf16, act.up_bf16, count);
    down_proj.forward_bf16(y, act.act_bf16, n);
    return;
  }
  linear_group_forward({{&gate_proj, act.gate}, {&up_proj, act.up}}, x, n, linear, act.x_bf16);
  // Otherwise bf16 projections (inference on bf16 weights; training under another kernel) return
  // gate and up rounded to bf16 in fp32, training keeping the bits for its backward.
  if (gate_proj.weight_bf16 != nullptr) {
    device_ops().round_to_bf16_keeping(act.gate, act.gate_bf16, count);
    device_ops().round_to_bf16_keeping(act.up, act.up_bf16, count);
  }
  swiglu->forward(act.act, act.gate, act.up, count);
  down_proj.forward(y, act.act, n, linear, act.act_bf16);
}

void SwigluMlp::backward(float* dx, MlpGradScratch& g, const float* dy, const MlpActivations& act,
                         const float* x, int64_t n, const LinearScratch& linear) const {
  // act is recomputed from the kept gate and up as the forward computed it, bit for bit: keeping
  // it would cost every layer N x I values. Under bf16 the kernel's bf16 forms read the kept
  // roundings themselves; a kernel without them (any kernel may be bound to the swiglu slot) gets
  // them widened into the shared scratch.
  const int64_t count = n * intermediate;
  // The bf16 forms give d gate and d up only rounded: gate_proj and up_proj biases (Llama's
  // mlp_bias) take the fp32 path, which computes the same roundings.
  const bool biased = gate_proj.bias != nullptr || up_proj.bias != nullptr;
  if (act.gate_bf16 != nullptr && swiglu->backward_bf16 != nullptr && !biased) {
    swiglu->recompute_bf16(act.act_bf16, act.gate_bf16, act.up_bf16, count);
    down_proj.backward(g.dact, dy, nullptr, n, false, linear, act.act_bf16);
    swiglu->backward_bf16(g.dgate_bf16, g.dup_bf16, g.dact, act.gate_bf16, act.up_bf16, count);
    linear_group_backward({{&gate_proj, nullptr, g.dgate_bf16}, {&up_proj, nullptr, g.dup_bf16}},
                          dx, x, n, false, linear, act.x_bf16);
    return;
  }
  if (act.gate_bf16 != nullptr) {
    device_ops().widen_bf16(act.gate, act.gate_bf16, count);
    device_ops().widen_bf16(act.up, act.up_bf16, count);
  }
  swiglu->forward(act.act, act.gate, act.up, count);
  if (act.act_bf16 != nullptr) device_ops().round_to_bf16(act.act_bf16, act.act, count);
  down_proj.backward(g.dact, dy, act.act, n, false, linear, act.act_bf16);
  swiglu->backward(g.dgate, g.dup, g.dact, act.gate, act.up, count);
  linear_group_backward({{&gate_proj, g.dgate}, {&up_proj, g.dup}}, dx, x, n, false, linear,
                        act.x_bf16);
}

ExpertsShape SparseMoeBlock::shape(int64_t n) const {
  return {n, hidden, intermediate, n_experts, top_k};
}

void SparseMoeBlock::check_constraints(int64_t n) const {
  require_constraints(name + ".experts", experts_kernel, *experts, shape(n));
}

bool SparseMoeBlock::staged() const {
  return experts->runs_stage_slots;
}

ExpertsShape SparseMoeBlock::local_shape(int64_t rows) const {
  return {rows, hidden, intermediate, n_experts / ep_degree, 1};
}

void SparseMoeBlock::forward(float* y, MoeActivations& act, const ExpertsScratch& s, const float* x,
                             int64_t n, const LayerCollectives* collectives) const {
  check_constraints(n);
  gate.forward(act.router_logits, x, n, {});
  router->forward(act.topk_index, act.topk_weight, act.router_probs, act.router_logits, n,
                  n_experts, top_k, norm_topk_prob);
  const ExpertsShape sh = shape(n);
  const ExpertWeights w = lora != nullptr ? lora->merged(weights) : weights;
  const ExpertWeightsBf16 wb =
      lora != nullptr && computes_in_bf16() ? lora->rounded(w, weights_bf16) : weights_bf16;
  if (ep_degree > 1) {
    TITAN_CHECK(staged(), name, ".experts: experts kernel '", experts_kernel,
                "' computes every expert in one call; expert parallel runs the stage slots ",
                "(experts_staged)");
    TITAN_CHECK(collectives != nullptr && collectives->all_to_all_v, name,
                ": the model holds expert-parallel parts of its experts, and its group's ",
                "all_to_all_v is not set (set_layer_collectives)");
    forward_expert_parallel(y, act, s, x, n, w, wb, collectives->all_to_all_v);
    return;
  }
  // The slot's dtype keeps an fp32-only kernel off a bf16 model (apply_overrides).
  if (!staged()) {
    if (computes_in_bf16()) {
      TITAN_CHECK(experts->forward_bf16 != nullptr, name, ".experts: experts kernel '",
                  experts_kernel, "' does not take bf16");
      experts->forward_bf16(y, act.experts, s, x, act.topk_index, act.topk_weight, wb, sh);
    } else {
      experts->forward(y, act.experts, s, x, act.topk_index, act.topk_weight, w, sh);
    }
    return;
  }
  const ExpertsActivations& e = act.experts;
  dispatch->plan(e.row_of, e.offsets, act.topk_index, sh);
  if (computes_in_bf16()) {
    auto* x_rows = reinterpret_cast<uint16_t*>(s.x);  // (R, h) in the first half of s.x
    dispatch->forward_bf16(x_rows, x, e.row_of, sh);
    grouped->forward_bf16(s.y, e, s, x_rows, e.offsets, wb, sh);
  } else {
    dispatch->forward(s.x, x, e.row_of, sh);
    grouped->forward(s.y, e, s, s.x, e.offsets, w, sh);
  }
  combine->forward(y, s.y, e.row_of, act.topk_index, act.topk_weight, sh);
}

void SparseMoeBlock::forward_expert_parallel(float* y, MoeActivations& act, const ExpertsScratch& s,
                                             const float* x, int64_t n, const ExpertWeights& w,
                                             const ExpertWeightsBf16& wb,
                                             const AllToAllV& all_to_all_v) const {
  TITAN_CHECK(act.expert_parallel != nullptr && ep_scratch != nullptr, name,
              ": expert parallel without room for the arrived rows");
  const ExpertsShape sh = shape(n);
  const ExpertsActivations& e = act.experts;
  ExpertParallelRows& kept = *act.expert_parallel;
  ExpertParallelScratch& room = *ep_scratch;
  dispatch->plan(e.row_of, e.offsets, act.topk_index, sh);
  kept.exchange.plan(e.offsets, n_experts, static_cast<int>(ep_rank), static_cast<int>(ep_degree),
                     all_to_all_v);
  const int64_t arrived = kept.exchange.arrived_rows();
  const ExpertsShape local = local_shape(arrived);
  const ExpertsScratch es = room.view(arrived, s);
  // The arrived rows' activations; their row ranges are the exchange's (offsets).
  const ExpertsActivations ea = {kept.gate, kept.up, room.act};
  const int32_t* offsets = kept.exchange.expert_offsets();
  if (computes_in_bf16()) {
    auto* x_rows = reinterpret_cast<uint16_t*>(s.x);  // (R, h) in the first half of s.x
    auto* arrived_x = reinterpret_cast<uint16_t*>(es.x);
    dispatch->forward_bf16(x_rows, x, e.row_of, sh);
    kept.exchange.to_experts(x_rows, arrived_x, hidden, DType::bf16, room.staging, all_to_all_v);
    grouped->forward_bf16(es.y, ea, es, arrived_x, offsets, wb, local);
  } else {
    dispatch->forward(s.x, x, e.row_of, sh);
    kept.exchange.to_experts(s.x, es.x, hidden, DType::f32, room.staging, all_to_all_v);
    grouped->forward(es.y, ea, es, es.x, offsets, w, local);
  }
  kept.exchange.from_experts(es.y, s.y, hidden, DType::f32, room.staging, all_to_all_v);
  combine->forward(y, s.y, e.row_of, act.topk_index, act.topk_weight, sh);
}

void SparseMoeBlock::backward_expert_parallel(float* dx, MoeGradScratch& g, const float* dy,
                                              const MoeActivations& act, const float* x, int64_t n,
                                              const ExpertWeights& w, const ExpertWeightsBf16& wb,
                                              const ExpertGrads& dw,
                                              const AllToAllV& all_to_all_v) const {
  TITAN_CHECK(act.expert_parallel != nullptr && ep_scratch != nullptr, name,
              ": expert parallel without room for the arrived rows");
  const ExpertsShape sh = shape(n);
  const ExpertsScratch& s = g.experts;
  const ExpertsActivations& e = act.experts;
  ExpertParallelRows& kept = *act.expert_parallel;
  ExpertParallelScratch& room = *ep_scratch;
  const ExpertExchange& exchange = kept.exchange;
  const int64_t arrived = exchange.arrived_rows();
  const ExpertsShape local = local_shape(arrived);
  const ExpertsScratch es = room.view(arrived, s);
  const ExpertsActivations ea = {kept.gate, kept.up, room.act};
  const int32_t* offsets = exchange.expert_offsets();
  // d out in factored form, as on one rank, each row's dy and weight sent to its expert's rank.
  combine->backward(s.y, s.w_rows, dy, act.topk_weight, e.row_of, sh);
  exchange.to_experts(s.y, es.y, hidden, DType::f32, room.staging, all_to_all_v);
  exchange.to_experts(s.w_rows, es.w_rows, 1, DType::f32, room.staging, all_to_all_v);
  // The rows' inputs again: other layers' forwards reused both rooms since this layer's.
  if (computes_in_bf16()) {
    auto* x_rows = reinterpret_cast<uint16_t*>(s.x);
    auto* arrived_x = reinterpret_cast<uint16_t*>(es.x);
    dispatch->forward_bf16(x_rows, x, e.row_of, sh);
    exchange.to_experts(x_rows, arrived_x, hidden, DType::bf16, room.staging, all_to_all_v);
    grouped->backward_bf16(es.y, es.dweight_rows, dw, es, es.w_rows, ea, arrived_x, offsets, wb,
                           local);
  } else {
    dispatch->forward(s.x, x, e.row_of, sh);
    exchange.to_experts(s.x, es.x, hidden, DType::f32, room.staging, all_to_all_v);
    grouped->backward(es.y, es.dweight_rows, dw, es, es.w_rows, ea, es.x, offsets, w, local);
  }
  exchange.from_experts(es.y, s.y, hidden, DType::f32, room.staging, all_to_all_v);
  exchange.from_experts(es.dweight_rows, s.dweight_rows, 1, DType::f32, room.staging, all_to_all_v);
  dispatch->backward(dx, g.dweight, s.y, s.dweight_rows, e.row_of, sh);
}

void SparseMoeBlock::backward(float* dx, MoeGradScratch& g, const float* dy,
                              const MoeActivations& act, const float* x, const float* dprobs_all,
                              int64_t n, const LayerCollectives* collectives) const {
  const ExpertsShape sh = shape(n);
  const ExpertsScratch& s = g.experts;
  const ExpertsActivations& e = act.experts;
  // With LoRA the experts' weight gradient is the merged weights', which the adapter's becomes.
  const ExpertWeights w = lora != nullptr ? lora->merged(weights) : weights;
  const ExpertWeightsBf16 wb =
      lora != nullptr && computes_in_bf16() ? lora->rounded(w, weights_bf16) : weights_bf16;
  const ExpertGrads dw = lora != nullptr ? lora->merged_grads() : grads;
  if (ep_degree > 1) {
    TITAN_CHECK(collectives != nullptr && collectives->all_to_all_v, name,
                ": the model holds expert-parallel parts of its experts, and its group's ",
                "all_to_all_v is not set (set_layer_collectives)");
    backward_expert_parallel(dx, g, dy, act, x, n, w, wb, dw, collectives->all_to_all_v);
  } else if (!staged()) {
    if (computes_in_bf16()) {
      experts->backward_bf16(dx, g.dweight, dw, s, dy, e, x, act.topk_index, act.topk_weight, wb,
                             sh);
    } else {
      experts->backward(dx, g.dweight, dw, s, dy, e, x, act.topk_index, act.topk_weight, w, sh);
    }
  } else {
    // d out in factored form (ops/moe_stages.h): each row's dy in s.y, its weight in s.w_rows.
    combine->backward(s.y, s.w_rows, dy, act.topk_weight, e.row_of, sh);
    // The rows' inputs again: other layers' forwards reused s.x since this layer's.
    if (computes_in_bf16()) {
      auto* x_rows = reinterpret_cast<uint16_t*>(s.x);
      dispatch->forward_bf16(x_rows, x, e.row_of, sh);
      grouped->backward_bf16(s.y, s.dweight_rows, dw, s, s.w_rows, e, x_rows, e.offsets, wb, sh);
    } else {
      dispatch->forward(s.x, x, e.row_of, sh);
      grouped->backward(s.y, s.dweight_rows, dw, s, s.w_rows, e, s.x, e.offsets, w, sh);
    }
    dispatch->backward(dx, g.dweight, s.y, s.dweight_rows, e.row_of, sh);
  }
  if (lora != nullptr) lora->backward(dw);
  router->backward(g.dlogits, g.dweight, dprobs_all, act.router_probs, act.topk_index, n, n_experts,
                   top_k, norm_topk_prob);
  gate.backward(dx, g.dlogits, x, n, true, {});
}

}  // namespace titan
