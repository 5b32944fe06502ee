// The building blocks every model file composes: each a module with a fully qualified Hugging Face
// name, pointers into its parameter group's flat buffers, the kernels bound to its op slots, and
// a forward / backward pair with mirrored arguments. Activations are passed in by the caller
// (the model carves them out of one arena), so a block can be recomputed for activation
// checkpointing by calling forward again on the same views.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "titan/kernels/overrides.h"
#include "titan/kernels/registry.h"
#include "titan/nn/param_group.h"
#include "titan/ops/moe.h"
#include "titan/ops/rope.h"

namespace titan {

// Resolves a module's slot to its kernel after overrides (kernels/overrides.h).
class KernelBinder {
 public:
  explicit KernelBinder(const std::vector<KernelSlot>& slots) : slots_(slots) {}
  const KernelEntry& bind(const std::string& module, OpKind kind) const;

 private:
  const std::vector<KernelSlot>& slots_;
};

struct Linear {
  std::string name;  // e.g. model.layers.0.self_attn.q_proj
  int64_t in_features = 0, out_features = 0;
  float* weight = nullptr;       // (out, in)
  float* weight_grad = nullptr;  // (out, in) or null
  const LinearKernel* kernel = nullptr;

  // y (N, out) = x (N, in) W^T
  void forward(float* y, const float* x, int64_t n) const;
  // dx (N, in) = dy W (or += when accumulate_dx), dW += dy^T x
  void backward(float* dx, const float* dy, const float* x, int64_t n, bool accumulate_dx) const;
};

struct RMSNorm {
  std::string name;
  int64_t dim = 0;
  float eps = 1e-6f;
  float* weight = nullptr;       // (dim)
  float* weight_grad = nullptr;  // (dim) or null
  const RmsNormKernel* kernel = nullptr;

  // out, x (R, dim); rstd (R)
  void forward(float* out, float* rstd, const float* x, int64_t rows) const;
  void backward(float* dx, const float* dout, const float* x, const float* rstd,
                int64_t rows) const;
};

struct Embedding {
  std::string name;
  int64_t vocab = 0, dim = 0;
  float* weight = nullptr;       // (V, dim)
  float* weight_grad = nullptr;  // (V, dim) or null
  const EmbeddingKernel* kernel = nullptr;

  void forward(float* out, const int32_t* ids, int64_t n) const;
  void backward(const float* dout, const int32_t* ids, int64_t n) const;
};

// Activations one self-attention module keeps for its backward (N = batch * seq tokens).
struct AttentionActivations {
  float* q_pre = nullptr;   // (N, H*hd) q_proj output, q_norm's input
  float* q_rstd = nullptr;  // (N*H)
  float* k_pre = nullptr;   // (N, KV*hd)
  float* k_rstd = nullptr;  // (N*KV)
  float* q = nullptr;       // (N, H, hd) after q_norm and RoPE
  float* k = nullptr;       // (N, KV, hd) after k_norm and RoPE
  float* v = nullptr;       // (N, KV, hd)
  float* out = nullptr;     // (N, H, hd) attention output, o_proj's input
  float* lse = nullptr;     // (B, H, S)
};

// Scratch of one cached (inference) attention call over n new tokens; no backward state kept.
struct AttentionCachedScratch {
  float* q = nullptr;     // (n, H, hd) after q_norm and RoPE
  float* out = nullptr;   // (n, H, hd) attention output, o_proj's input
  float* rstd = nullptr;  // (n * H) q_norm / k_norm row scales, discarded
  float* lse = nullptr;   // (H, n)
};

struct AttentionGradScratch {
  float* dq = nullptr;    // (N, H*hd)
  float* dk = nullptr;    // (N, KV*hd)
  float* dv = nullptr;    // (N, KV*hd)
  float* dout = nullptr;  // (N, H*hd)
};

// Qwen3 self-attention: q/k/v projections, per-head q_norm/k_norm, RoPE, causal GQA, o_proj.
struct SelfAttention {
  std::string name;  // model.layers.{i}.self_attn
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  Linear q_proj, k_proj, v_proj, o_proj;
  RMSNorm q_norm, k_norm;
  const AttentionKernel* attention = nullptr;
  std::string attention_kernel;  // registry name, for error messages
  const RopeKernel* rope = nullptr;

  // y (N, h) = attention of x (N, h); positions (N)
  void forward(float* y, AttentionActivations& act, const float* x, const int32_t* positions,
               const RopeCache& rope_cache, int64_t batch, int64_t seq) const;
  // dx (N, h) = d y / d x given dy; parameter gradients accumulated.
  void backward(float* dx, AttentionGradScratch& scratch, const float* dy,
                const AttentionActivations& act, const float* x, const int32_t* positions,
                const RopeCache& rope_cache, int64_t batch, int64_t seq) const;
  // Inference against a KV cache of one sequence, between the projections (the caller runs
  // them, from fp32 or bf16 weights): the n new tokens at absolute positions [past, past + n)
  // attend over cache rows [0, past + n). q_pre (n, H*hd) and k_pre (n, KV*hd) are their q and k
  // projections; their v projection is already in rows [past, past + n) of v_cache. Their k
  // (after k_norm and RoPE) is written into those rows of k_cache (caches (max_len, KV, hd)),
  // the attention output into scratch.out (n, H*hd), o_proj's input. q_pre may be scratch.out.
  void attend_cached(const AttentionCachedScratch& scratch, const float* q_pre, const float* k_pre,
                     const int32_t* positions, const RopeCache& rope_cache, float* k_cache,
                     const float* v_cache, int64_t past, int64_t n) const;
  AttentionShape shape(int64_t batch, int64_t seq) const;
  // The attention kernel's constraint for this shape (titan::Error when broken).
  void check_constraints(int64_t batch, int64_t seq) const;
};

struct MlpActivations {
  float* gate = nullptr;  // (N, I)
  float* up = nullptr;    // (N, I)
  float* act = nullptr;   // (N, I) silu(gate) * up, down_proj's input
};

struct MlpGradScratch {
  float* dgate = nullptr;  // (N, I)
  float* dup = nullptr;    // (N, I)
  float* dact = nullptr;   // (N, I)
};

// down_proj(silu(gate_proj(x)) * up_proj(x))
struct SwigluMlp {
  std::string name;  // model.layers.{i}.mlp
  int64_t hidden = 0, intermediate = 0;
  Linear gate_proj, up_proj, down_proj;
  const SwigluKernel* swiglu = nullptr;

  void forward(float* y, MlpActivations& act, const float* x, int64_t n) const;
  void backward(float* dx, MlpGradScratch& scratch, const float* dy, const MlpActivations& act,
                const float* x, int64_t n) const;
};

// Activations one sparse MoE block keeps for its backward (N tokens, E experts, top k).
struct MoeActivations {
  float* router_logits = nullptr;  // (N, E) mlp.gate output
  float* router_probs = nullptr;   // (N, E) softmax of the logits, fp32
  int32_t* topk_index = nullptr;   // (N, k) chosen experts, by descending probability
  float* topk_weight = nullptr;    // (N, k) their routing weights
  ExpertsActivations experts;      // N*k rows
};

struct MoeGradScratch {
  float* dlogits = nullptr;  // (N, E)
  float* dweight = nullptr;  // (N, k) d loss / d routing weights
  ExpertsScratch experts;    // N*k rows; the forward's gathered rows too
};

// Qwen3-MoE's sparse block (Qwen3MoeSparseMoeBlock): the router mlp.gate picks k of E experts
// per token from softmax probabilities (renormalised over the k when norm_topk_prob); the output
// is the routing-weighted sum of those experts' SwiGLU MLPs. No shared expert.
struct SparseMoeBlock {
  std::string name;                      // model.layers.{i}.mlp
  int64_t hidden = 0, intermediate = 0;  // h, Im (one expert's width)
  int64_t n_experts = 0, top_k = 0;      // E, k
  bool norm_topk_prob = false;
  Linear gate;            // the router, (E, h), model.layers.{i}.mlp.gate
  ExpertWeights weights;  // the stacked model.layers.{i}.mlp.experts.{gate,up,down}_proj
  ExpertGrads grads;      // or nulls
  const ExpertsKernel* experts = nullptr;
  std::string experts_kernel;  // registry name, for error messages

  ExpertsShape shape(int64_t n) const;
  // The experts kernel's constraint for n tokens (titan::Error when broken).
  void check_constraints(int64_t n) const;
  // y (N, h) from x (N, h); `scratch` is only used during the call.
  void forward(float* y, MoeActivations& act, const ExpertsScratch& scratch, const float* x,
               int64_t n) const;
  // dx (N, h) = d y / d x given dy, parameter gradients accumulated (router included).
  // dprobs_all (E), optional: the load-balancing loss's gradient on every row's probabilities.
  void backward(float* dx, MoeGradScratch& scratch, const float* dy, const MoeActivations& act,
                const float* x, const float* dprobs_all, int64_t n) const;
};

}  // namespace titan
