// Qwen3 causal LM, dense and MoE, as Hugging Face's Qwen3ForCausalLM and Qwen3MoeForCausalLM
// compute it (docs: qwen3-spec.md): embed -> L x [x + attn(norm(x)), x + mlp(norm(x))] -> norm
// -> lm_head -> shifted CE, each layer's mlp a dense SwiGLU or a sparse MoE block
// (ModelArgs::layer_is_sparse), plus the load-balancing loss when output_router_logits.
// Module and parameter names are the HF state-dict keys. Parameters live in one ParamGroup per
// decoder layer plus one for embed_tokens / norm / lm_head (nn/param_group.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/kernels/overrides.h"
#include "titan/models/model_args.h"
#include "titan/nn/layers.h"
#include "titan/nn/param_group.h"
#include "titan/ops/cross_entropy.h"
#include "titan/ops/rope.h"

namespace titan {

struct DecoderLayer {
  std::string name;  // model.layers.{i}
  RMSNorm input_layernorm;
  SelfAttention self_attn;
  RMSNorm post_attention_layernorm;
  bool sparse = false;  // the MLP is `moe`, else `mlp`
  SwigluMlp mlp;
  SparseMoeBlock moe;
};

struct ForwardOptions {
  bool compute_grad = false;  // also run d loss / d logits into the lm_head (fused CE)
  float grad_scale = 0.0f;    // gradients are of sum(token losses) * grad_scale
  float* logits = nullptr;    // optional (B, S, V) output
  // With args().output_router_logits, the gradients also include router_aux_loss_coef *
  // aux_loss_scale * the load-balancing loss (1 / micro-batches when accumulating).
  float aux_loss_scale = 1.0f;
};

class Qwen3Model {
 public:
  // Builds the module tree and allocates parameters (not yet initialised). Overrides rebind
  // kernel slots; what they did is in override_report().
  explicit Qwen3Model(const ModelArgs& args, const std::vector<OverrideRule>& overrides = {});

  const ModelArgs& args() const { return args_; }
  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  const std::vector<KernelSlot>& kernel_slots() const { return slots_; }
  const OverrideReport& override_report() const { return override_report_; }
  int64_t parameter_count() const;

  // HF init (normal(0, initializer_range), norms 1), deterministic in `seed`.
  void initialize(uint64_t seed);
  void allocate_gradients();
  void zero_gradients();

  // input_ids, labels: (B, S). labels as torchtitan's: labels[s] is the token position s
  // predicts (already shifted; Hugging Face's labels, aligned with the inputs, become
  // labels[s] = hf_labels[s + 1] with -100 last); -100 is ignored; labels may be null (no loss).
  // Returns the loss sum and the number of scored tokens; the mean loss is loss_sum / n_scored.
  CrossEntropyResult forward(const int32_t* input_ids, const int32_t* labels, int64_t batch,
                             int64_t seq, const ForwardOptions& options);
  // The load-balancing loss of the last forward (qwen3-spec.md §2.3), computed when
  // args().output_router_logits and the model has sparse layers, else 0. HF's loss with labels
  // is loss_sum / n_scored + router_aux_loss_coef * aux_loss().
  double aux_loss() const { return aux_loss_; }
  // Backward of the last forward (which must have had compute_grad): accumulates every
  // parameter gradient.
  void backward();

  // Every bound kernel's constraint for inputs of (batch, seq); a broken one is a titan::Error
  // naming the module, the kernel and the constraint. forward() checks too; the trainer calls
  // this at start-up so a bad override fails before anything is allocated.
  void check_kernel_constraints(int64_t batch, int64_t seq) const;

  // Activation checkpointing "full": keep only each layer's input and recompute the layer's
  // forward inside the backward (one layer's activations live at a time).
  void set_activation_checkpointing(bool full);
  bool activation_checkpointing() const { return checkpoint_layers_; }

  // Bytes of the activation arena for (batch, seq): what the backward must keep.
  int64_t activation_bytes(int64_t batch, int64_t seq) const;
  // Bytes of the lm_head loss's logits chunk for (batch, seq), held beside the arena (the
  // backward needs none of it; it is kept only so each step does not fault its pages in again).
  int64_t lm_head_scratch_bytes(int64_t batch, int64_t seq) const;

  // The module tree, read-only, for forwards that compose it differently (infer/session.h).
  const Embedding& embed_tokens() const { return embed_tokens_; }
  const std::vector<DecoderLayer>& layers() const { return layers_; }
  const RMSNorm& final_norm() const { return norm_; }
  const float* lm_head_weight() const { return lm_head_weight_; }  // (V, h)

 private:
  struct LayerActivations {
    float* norm1 = nullptr;       // (N, h)
    float* norm1_rstd = nullptr;  // (N)
    AttentionActivations attn;
    float* resid_mid = nullptr;   // (N, h) x + attention
    float* norm2 = nullptr;       // (N, h)
    float* norm2_rstd = nullptr;  // (N)
    MlpActivations mlp;           // dense layers
    MoeActivations moe;           // sparse layers
  };
  // Every view of the activation arena.
  struct Activations {
    std::vector<float*> resid;             // L + 1 residual streams, each (N, h)
    std::vector<LayerActivations> layers;  // one per layer, or one shared when checkpointing
    float* final_norm = nullptr;           // (N, h)
    float* final_norm_rstd = nullptr;      // (N)
    // Backward scratch shared by all layers (moe_grad.experts also serves the forward).
    float* d_resid = nullptr;  // (N, h)
    float* d_norm = nullptr;   // (N, h)
    AttentionGradScratch attn_grad;
    MlpGradScratch mlp_grad;
    MoeGradScratch moe_grad;
  };
  // Carves the activations of (batch, seq) out of `base` into `v` (a null base only measures);
  // returns the floats taken. The one table both ensure_activations and activation_bytes use.
  int64_t carve_activations(float* base, int64_t batch, int64_t seq, Activations& v) const;
  void ensure_activations(int64_t batch, int64_t seq);
  // Layer i from acts_.resid[i] to acts_.resid[i + 1], keeping what its backward needs in `a`.
  void layer_forward(size_t i, LayerActivations& a);

  ModelArgs args_;
  std::vector<KernelSlot> slots_;
  OverrideReport override_report_;
  std::vector<ParamGroup> groups_;  // [0]: embed_tokens, norm, lm_head; [1 + i]: layer i
  Embedding embed_tokens_;
  std::vector<DecoderLayer> layers_;
  RMSNorm norm_;
  float* lm_head_weight_ = nullptr;  // (V, h): the embedding when tied
  float* lm_head_weight_grad_ = nullptr;
  const LmHeadLossKernel* lm_head_loss_ = nullptr;
  RopeCache rope_cache_;

  // The activation arena and its views, sized for (batch_, seq_).
  int64_t batch_ = 0, seq_ = 0;
  Buffer arena_;
  Activations acts_;
  std::vector<int32_t> ids_, positions_, targets_;
  Buffer logits_chunk_;  // (chunk, V) lm_head loss scratch, kept across steps
  // The load-balancing loss over all sparse layers of the last forward.
  int64_t n_sparse_layers_ = 0;
  std::vector<double> router_counts_;     // (E) tokens routed to each expert
  std::vector<double> router_prob_sums_;  // (E) summed router probabilities
  std::vector<float> aux_dprobs_;         // (E) its gradient on every row's probabilities
  double aux_loss_ = 0.0;
  bool aux_grad_ = false;
  bool grad_ready_ = false;
  bool checkpoint_layers_ = false;
};

}  // namespace titan
