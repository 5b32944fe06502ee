// The model interface: everything the trainer, `titan eval`, `titan generate`, `convert` and
// `info` ask of a causal language model, whatever its family. A model is made from its ModelArgs
// (make_model); Hugging Face's `architectures` name picks the family (models/registry.h).
//
// Parameters live in flat ParamGroups (nn/param_group.h), the units FSDP shards and gathers, as
// torchtitan wraps them: [0] the embedding, then one per transformer block, then [norm, lm_head];
// when the embedding is tied to the lm_head, [0] holds all three and there is no last group.
// ParamGroupHooks let a parallelism act around every use of a group.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "titan/dispatch/overrides.h"
#include "titan/models/activation_checkpointing.h"
#include "titan/models/lora.h"
#include "titan/models/model_args.h"
#include "titan/nn/decoder_layer.h"
#include "titan/nn/param_group.h"
#include "titan/ops/cross_entropy.h"

namespace titan {

struct ForwardOptions {
  bool compute_grad = false;  // also run d loss / d logits into the lm_head (fused CE)
  float grad_scale = 0.0f;    // gradients are of sum(token losses) * grad_scale
  float* logits = nullptr;    // optional (B, S, V) output
  // With args().output_router_logits, the gradients also include router_aux_loss_coef *
  // aux_loss_scale * the load-balancing loss (1 / the micro-batches the step averages it over).
  float aux_loss_scale = 1.0f;
  // With args().output_router_logits: sums the load-balancing loss's statistics, (2 E + 1)
  // doubles -- the tokens routed to each expert, the summed router probabilities of each, the
  // router rows -- over the ranks holding the other tokens of this micro-batch step, in place
  // (every rank calls it once per forward, after the last layer), so the loss and its gradient are
  // the formula's over their tokens together (the trainer's data-parallel group under
  // model.router_aux_loss_scope = "global"). Unset: this call's tokens alone.
  std::function<void(double* statistics, int64_t count)> sum_router_statistics = {};
  // Packed rows (several sequences one after another in a row, e.g. conversations): (B, S), the
  // position in its row where each token's sequence starts (ops/attention.h's segment_start).
  // Attention stays inside each sequence and positions (RoPE) restart at each start, so a packed
  // row computes what its sequences compute run alone. Null: one sequence per row.
  const int32_t* segment_start = nullptr;
};

// Every use of a parameter group by the forward and backward, for a parallelism to act around:
// FSDP gathers the group's parameters in `acquire` and frees them in `release`, and when the use
// accumulated into the group's gradients (acquired with `gradients`; ended GroupUseEnd::gradients),
// reduce-scatters them in `release`. Every read of a group's parameters, and every write of its
// gradients, lies between an acquire and the matching release. Per training micro-batch: the
// embedding unit for the embedding's forward; block i (group 1 + i) for its forward; the
// [norm, lm_head] unit (the embedding unit when tied) for the final norm, the loss and their
// backward, from the forward into the backward; block i for its backward (with, under activation
// checkpointing, the recompute of its forward), last block first; the embedding unit for the
// embedding's backward.
//
// Each acquire says what the use reads (GroupReads): the embedding's forward and the blocks their
// parameters; the final norm and loss the norm and the lm_head through its copy (under bf16 a tied
// embedding there is only its copy); the embedding's backward nothing, only its gradients.
//
// After an acquire, the model names the group it will acquire next when it knows it, and what that
// use reads (`prefetch`, optional): FSDP starts gathering it then, under this use's compute. The
// forward prefetches each next block, then the [norm, lm_head] unit, and with gradients the last
// block for the backward; the backward each previous block (the embedding's backward reads
// nothing to prefetch).
//
// Under bf16 compute, `fills_compute_copies`: the acquire (from its prefetch on, where there is
// one: the model makes the copies a prefetched use reads resident before it) writes the bf16
// copies the model names in bf16_only_params() (FSDP gathers them in bf16) and leaves those
// parameters' fp32 masters unwritten, and for a use through_copies every copy, a tied embedding's
// too (copied_params()); the model rounds only its other copies. A unit the parallelism keeps
// whole between uses (still resident after its release) keeps its copies too.
// What one call of a KV-cached inference session (infer/session.h) computes in, for calls of up to
// `max_chunk` tokens: the residual stream updated in place layer by layer, one layer's activations
// every layer reuses (nothing is kept for a backward), the last token's logits, and the linears'
// rounding scratch. Carved by the model's activation table (CausalLM::carve_inference).
struct InferenceShape {
  int64_t max_chunk = 1;
  DType weights = DType::f32;   // the linears' weights: bf16 rounds each GEMM's input
  DType kv_cache = DType::f32;  // bf16: this call's keys and values in fp32 before rounding
};
struct InferenceScratch {
  float* resid = nullptr;   // (n, h)
  float* norm = nullptr;    // (n, h) the final norm's output
  float* rstd = nullptr;    // (n) its discarded row scales
  LayerActivations layer;   // every layer's, in turn
  ExpertsScratch experts;   // the routed rows, forward only
  float* logits = nullptr;  // (V) the last token's
  LinearScratch linear;
};

struct ParamGroupHooks {
  std::function<void(int64_t group, bool gradients, GroupReads reads)> acquire;
  std::function<void(int64_t group, GroupUseEnd end)> release;
  std::function<void(int64_t group, GroupReads reads)> prefetch;
  bool fills_compute_copies = false;
};

// What a model computing in `compute` (CausalLM::compute_dtype) does in which dtype, for the
// start-up lines of titan train and titan eval: "matmuls in bf16 with fp32 accumulation, the rest
// in fp32" or "fp32 throughout".
const char* describe_compute_dtype(DType compute);

class CausalLM {
 public:
  virtual ~CausalLM() = default;

  virtual const ModelArgs& args() const = 0;
  // What the matmuls compute in: f32, or bf16 operands with fp32 accumulation (mixed precision:
  // fp32 master weights, bf16 copies made at each forward; norms, softmax, router and loss fp32).
  virtual DType compute_dtype() const = 0;
  virtual std::vector<ParamGroup>& param_groups() = 0;
  virtual const std::vector<ParamGroup>& param_groups() const = 0;
  virtual const std::vector<KernelSlot>& kernel_slots() const = 0;
  virtual const OverrideReport& override_report() const = 0;
  int64_t parameter_count() const;

  // HF init (normal(0, initializer_range), norms 1, biases 0), deterministic in `seed`.
  virtual void initialize(uint64_t seed) = 0;
  virtual void allocate_gradients() = 0;
  void zero_gradients();
  // LoRA (models/lora.h): every adapted linear adds the adapter's update, and every group of the
  // model is frozen (allocate_gradients gives it no gradients; the backward computes only the
  // activations' gradients and the adapter's). Before allocate_gradients and before FSDP's hooks;
  // under tensor parallel the adapter cut by the model's plan, under expert parallel none on the
  // experts; a titan::Error otherwise. The adapter must outlive the model's use.
  virtual void attach_lora(const LoraAdapter& adapter) = 0;

  // input_ids, labels: (B, S). labels as torchtitan's: labels[s] is the token position s
  // predicts (already shifted; Hugging Face's labels, aligned with the inputs, become
  // labels[s] = hf_labels[s + 1] with -100 last); -100 is ignored; labels may be null (no loss).
  // Returns the loss sum and the number of scored tokens; the mean loss is loss_sum / n_scored.
  virtual CrossEntropyResult forward(const int32_t* input_ids, const int32_t* labels, int64_t batch,
                                     int64_t seq, const ForwardOptions& options) = 0;
  // The load-balancing loss of the last forward (qwen3-spec.md §2.3) when args().output_router_
  // logits and the model has sparse layers, else 0. HF's loss with labels is
  // loss_sum / n_scored + router_aux_loss_coef * aux_loss().
  virtual double aux_loss() const = 0;
  // Backward of the last forward (which must have had compute_grad): accumulates every
  // parameter gradient.
  virtual void backward() = 0;

  // Every bound kernel's constraint for inputs of (batch, seq); a broken one is a titan::Error
  // naming the module, the kernel and the constraint. The trainer calls this at start-up so a
  // bad override fails before anything is allocated.
  virtual void check_kernel_constraints(int64_t batch, int64_t seq) const = 0;
  // What each layer keeps for its backward and what the backward computes again
  // (models/activation_checkpointing.h); none unless set.
  virtual void set_activation_checkpointing(const ActivationCheckpointing& checkpointing) = 0;
  virtual const ActivationCheckpointing& activation_checkpointing() const = 0;
  // For a model only ever run forward (titan eval): its activations keep nothing for a backward
  // (one layer's set, as under checkpointing, and two residual streams in turn rather than one
  // per layer), and it refuses gradients from then on.
  virtual void set_forward_only() = 0;
  virtual void set_param_group_hooks(ParamGroupHooks hooks) = 0;
  // Tensor parallel's reductions at every decoder layer's block boundaries, and sequence
  // parallel's gathers and reduce-scatters there (nn/layers.h); unset, one rank's model.
  virtual void set_layer_collectives(LayerCollectives collectives) = 0;
  // Per group, the parameters read only through bf16 copies under bf16 compute -- every matmul
  // weight but one whose fp32 master is read too (a tied embedding: the lookup; the experts a LoRA
  // adapter adapts: its merge) -- with where their
  // copies live; empty lists in fp32. What a parallelism may gather in bf16 (ParamGroupHooks).
  virtual std::vector<std::vector<ComputeCopyTarget>> bf16_only_params() = 0;
  // Per group, every parameter with a bf16 copy under bf16 compute -- bf16_only_params() and a tied
  // embedding (its copy: the lm_head's) -- with where the copies live: what a use through_copies
  // reads in bf16 (GroupReads).
  virtual std::vector<std::vector<ComputeCopyTarget>> copied_params() = 0;
  // Under bf16 compute, for a model whose weights never change -- one only ever run forward
  // (titan eval, titan generate), or a frozen LoRA base (train/lora_job.h: lora.base_dtype =
  // "bfloat16") -- its bf16 copies become its weights: every group's resident at once and read as
  // they are by each forward and backward, never remade from the fp32 masters, which need not be
  // held (load_forward_only_model loads a folder straight into the copies). With `lookup_in_bf16`
  // the embedding's lookup reads a bf16 copy too (a tied embedding the lm_head's; an untied one
  // gets its own). Returns where each copy lies: copied_params(), and an untied embedding's when
  // the lookup reads bf16. The model refuses to allocate gradients from then on (a frozen model
  // has none to allocate).
  virtual std::vector<std::vector<ComputeCopyTarget>> hold_compute_copies(bool lookup_in_bf16) = 0;
  // Whether hold_compute_copies was called.
  virtual bool compute_copies_held() const = 0;

  // Bytes of the activation arena for (batch, seq): what the backward must keep, the scratch the
  // layers share and the lm_head loss's logits chunk.
  virtual int64_t activation_bytes(int64_t batch, int64_t seq) const = 0;
  // Carves an inference session's scratch of `shape` out of `base` into `scratch` (a null base
  // only measures); returns the 4-byte words taken. The same table as the training arena's, in
  // the same file (models/decoder_lm_activations.cpp).
  virtual int64_t carve_inference(const InferenceShape& shape, void* base,
                                  InferenceScratch& scratch) const = 0;

  // The module tree, read-only, for forwards that run it another way (KV-cached decode,
  // infer/session.h).
  virtual const DecoderModules& modules() const = 0;
};

}  // namespace titan
