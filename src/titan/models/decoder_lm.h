// The decoder-only causal LM of the Llama family as Hugging Face computes it -- LlamaForCausalLM,
// Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM (docs: qwen3-spec.md): embed ->
// L x [x + attn(norm(x)), x + mlp(norm(x))] -> norm -> lm_head -> CE, each layer's mlp a dense
// SwiGLU or a sparse MoE block (ModelArgs::layer_is_sparse), its blocks' biases and q/k norm as
// ModelArgs says, plus the load-balancing loss when output_router_logits. Module and parameter
// names are the HF state-dict keys.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/models/causal_lm.h"
#include "titan/nn/parallel_plan.h"

namespace titan {

// How one rank's arena is cut (DecoderLM::activation_bytes_of): on a rank of `tp_degree`
// tensor-parallel ranks its local heads and MLP width and its vocabulary-parallel loss's workspace,
// and with `sequence_parallel` its seq / tp_degree tokens of each sequence in the residual stream
// and the norms (seq must divide by the degree: titan::Error naming training.seq_len); on a rank of
// `ep_degree` expert-parallel ranks, the rooms for the most rows that can arrive at its experts
// (carve_expert_parallel) -- under TP with ep_degree 1 its part of each expert's width for every
// token (expert tensor parallel); `lora`: a LoRA run's arena (Retention::lora); `lm_head_loss`:
// the kernel bound to lm_head, whose workspace the arena holds (null: the device's default).
// Named fields, so that a call says which it sets.
struct ArenaLayout {
  int64_t tp_degree = 1;
  bool sequence_parallel = false;
  int64_t ep_degree = 1;
  bool lora = false;
  const LmHeadLossKernel* lm_head_loss = nullptr;
};

class DecoderLM final : public CausalLM {
 public:
  // Builds the module tree and allocates parameters (not yet initialised). Overrides rebind
  // kernel slots; what they did is in override_report(). compute_dtype: f32 or bf16. params:
  // the groups' residency (make_model). plan: the parts of the parameters this rank holds
  // (models/parallelize.h); the modules take their sizes from them.
  explicit DecoderLM(const ModelArgs& args, const std::vector<OverrideRule>& overrides = {},
                     DType compute_dtype = DType::f32, Residency params = Residency::committed,
                     const ParallelizePlan& plan = {});

  const ModelArgs& args() const override { return args_; }
  DType compute_dtype() const override { return compute_dtype_; }
  std::vector<ParamGroup>& param_groups() override { return groups_; }
  const std::vector<ParamGroup>& param_groups() const override { return groups_; }
  const std::vector<KernelSlot>& kernel_slots() const override { return slots_; }
  const OverrideReport& override_report() const override { return override_report_; }

  void initialize(uint64_t seed) override;
  void allocate_gradients() override;
  void attach_lora(const LoraAdapter& adapter) override;

  CrossEntropyResult forward(const int32_t* input_ids, const int32_t* labels, int64_t batch,
                             int64_t seq, const ForwardOptions& options) override;
  double aux_loss() const override { return aux_loss_; }
  void backward() override;

  void check_kernel_constraints(int64_t batch, int64_t seq) const override;
  void set_activation_checkpointing(const ActivationCheckpointing& checkpointing) override;
  const ActivationCheckpointing& activation_checkpointing() const override {
    return checkpointing_;
  }
  void set_forward_only() override;
  void set_param_group_hooks(ParamGroupHooks hooks) override { hooks_ = std::move(hooks); }
  // Under a tensor-parallel plan the group's reductions (both: sum_partials and all_reduce_max)
  // must be set before a forward, and under sequence parallel all_gather and reduce_scatter too;
  // the vocabulary shard's reductions are bound to them.
  void set_layer_collectives(LayerCollectives collectives) override;
  std::vector<std::vector<ComputeCopyTarget>> bf16_only_params() override;
  std::vector<std::vector<ComputeCopyTarget>> copied_params() override;
  std::vector<std::vector<ComputeCopyTarget>> hold_compute_copies(bool lookup_in_bf16) override;
  bool compute_copies_held() const override { return copies_held_; }

  int64_t activation_bytes(int64_t batch, int64_t seq) const override;
  int64_t carve_inference(const InferenceShape& shape, void* base,
                          InferenceScratch& scratch) const override;
  const DecoderModules& modules() const override { return m_; }

  // The same for a model of `args` computing in `compute_dtype` under `checkpointing`, without
  // building it (titan plan), on a rank of `layout`.
  static int64_t activation_bytes_of(const ModelArgs& args, DType compute_dtype,
                                     const ActivationCheckpointing& checkpointing, int64_t batch,
                                     int64_t seq, const ArenaLayout& layout = {});
  // Of those, the rooms for the rows arriving from the EP group (0 without expert parallel).
  static int64_t expert_parallel_bytes_of(const ModelArgs& args, DType compute_dtype,
                                          const ActivationCheckpointing& checkpointing,
                                          int64_t batch, int64_t seq, const ArenaLayout& layout);
  // Under bf16 compute, whether the parameter `name` is read only through its bf16 copy: the
  // matmul weights -- q/k/v/o, the dense MLP's projections, the stacked experts, an untied lm_head
  // -- not the router (mlp.gate), norms or biases, nor a tied embedding (the lookup reads it in
  // fp32). What FSDP gathers in bf16 (bf16_only_params) and the plan counts.
  static bool read_only_in_bf16(const std::string& name);

 private:
  // Every view of the activation arena.
  struct Activations {
    std::vector<float*> resid;  // L + 1 residual streams, each (N, h)
    // One per layer; the layers whose forward runs again in the backward (and every layer of a
    // model only run forward) point at one shared set.
    std::vector<LayerActivations> layers;
    float* final_norm = nullptr;       // (N, h)
    float* final_norm_rstd = nullptr;  // (N)
    // Backward scratch shared by all layers (grad.moe.experts also serves the forward).
    float* d_resid = nullptr;  // (N, h)
    LayerGradScratch grad;
    LinearScratch linear;  // bf16 compute: (N, widest input) and (N, widest output) in bf16
    // The lm_head loss's (lm_head_workspace_bytes), over the layers' shared scratch.
    void* loss_workspace = nullptr;
    // Sequence parallel's whole-sequence scratch (degree 1 and nulls without it); `gathered` is
    // also the final norm's output gathered for the loss, `partial` the embedding's partial rows
    // and their gradient gathered, `d_rows` the loss's d x at this rank's rows.
    SequenceShards sequence;
    // EP x TP without sequence parallel: the sparse blocks' rows (LayerCall::sparse_shard).
    SparseBlockShard sparse_shard;
  };
  // What the activation arena keeps for a backward: as `checkpointing` says (every layer's saved
  // tensors; only the inputs of the layers it recomputes, whose sets are one shared set; no norm
  // outputs under selective op), or nothing (a model only run forward: one layer's set, two
  // residual streams in turn, no backward scratch).
  struct Retention {
    ActivationCheckpointing checkpointing;
    bool forward_only = false;
    // A LoRA run (the base frozen): under mode none, too, the layers keep no RMSNorm outputs and
    // make them again in the backward, as under selective op. With every projection adapted the
    // adapters' A gradients read each norm's output, so nothing is kept for frozen weights alone;
    // remaking the two norms is two row passes a layer beside its GEMMs, for 2 h floats a token
    // a layer (docs/PERFORMANCE.md "LoRA against full fine-tuning").
    bool lora = false;
    // Whether layer i uses the one set the recomputed layers share.
    bool shares_set(int64_t i) const { return forward_only || checkpointing.recomputes_layer(i); }
    // Whether the layers keep no RMSNorm outputs (one room for all, filled in the backward).
    bool remakes_norms() const {
      return !forward_only &&
             (lora ? checkpointing.lora_remakes_norms() : checkpointing.remakes_norms());
    }
  };
  Retention retention() const { return {checkpointing_, forward_only_, lora_attached_}; }
  // Carves the activations of (batch, seq) of a model of `args` out of `base` into `v` (a null
  // base only measures); returns the floats taken. The one table both ensure_activations and
  // activation_bytes use. tp_degree: the tensor-parallel ranks the heads, the MLP width and the
  // vocabulary are cut over (1: none); sequence_parallel: and each sequence's tokens, in the
  // residual stream and the norms; ep_degree: the expert-parallel ranks (under TP, 1: the experts'
  // width cut over the TP ranks, the sparse blocks on the whole rows; above 1: the sparse blocks
  // on the rank's sequence shard); loss: the kernel bound to lm_head, whose workspace it holds.
  static int64_t carve_activations(const ModelArgs& args, DType compute_dtype,
                                   const Retention& retention, int64_t tp_degree,
                                   bool sequence_parallel, int64_t ep_degree,
                                   const LmHeadLossKernel& loss, float* base, int64_t batch,
                                   int64_t seq, Activations& v);
  // Under expert parallel (ep_degree > 1; 0 floats otherwise), carved after the activations: the
  // room every sparse layer shares while it runs and each activation set's kept gate and up, for
  // the most rows that can arrive at a rank (nn/expert_parallel.h most_arrived_rows: every
  // rank's tokens choosing this rank's experts), so that no routing needs more than the arena.
  // Fills `scratch` and one ExpertParallelRows room per set in `sets` (null: only measures).
  // A rank routes its tokens, or under EP x TP (tp_degree > 1) its sequence shard of them.
  static int64_t carve_expert_parallel(const ModelArgs& args, DType compute_dtype,
                                       const Retention& retention, int64_t ep_degree,
                                       int64_t tp_degree, float* base, int64_t batch, int64_t seq,
                                       ExpertParallelScratch& scratch,
                                       std::vector<std::unique_ptr<ExpertParallelRows>>* sets);
  static int64_t arena_floats(const ModelArgs& args, DType compute_dtype,
                              const Retention& retention, int64_t tp_degree, bool sequence_parallel,
                              int64_t ep_degree, const LmHeadLossKernel& loss, int64_t batch,
                              int64_t seq);
  void ensure_activations(int64_t batch, int64_t seq);
  // This call's rows: packed (segment starts copied, positions restarting at each) or, for null,
  // one sequence each (positions 0..seq-1), for the forward and its backward.
  void set_row_segments(const int32_t* segment_start);
  // Layer i from acts_.resid[i] to acts_.resid[i + 1], keeping what its backward needs in `a`.
  void layer_forward(size_t i, LayerActivations& a);
  // bf16 compute: lays out one bf16 copy of every matmul weight (the router's excepted) in its
  // group's compute copy and points the modules at it. The [norm, lm_head] unit's copies get the
  // parameters' residency; the blocks' start released (made at each use: acquire).
  void allocate_compute_weights(Residency head_residency);
  // Per group, the parameters with bf16 copies and where the copies are: those read only in bf16,
  // and with `with_master_read` a tied embedding too (bf16_only_params, copied_params).
  std::vector<std::vector<ComputeCopyTarget>> copy_targets(bool with_master_read);
  // Points `group`'s modules at its copies laid out from `base` (its own buffer, or in one process
  // the buffer of the block in flight).
  void bind_compute_copies(int64_t group, uint16_t* base);

  ModelArgs args_;
  DType compute_dtype_ = DType::f32;
  std::vector<KernelSlot> slots_;
  OverrideReport override_report_;
  // [0]: embed_tokens (+ norm when tied); [1 + i]: layer i; [head_group_]: norm, lm_head -- the
  // last group, or 0 when the lm_head is the embedding (state_dict_adapter's model_param_specs).
  std::vector<ParamGroup> groups_;
  int64_t head_group_ = 0;  // head_group_index(args_)
  DecoderModules m_;
  const LmHeadLossKernel* lm_head_loss_ = nullptr;
  RopeCache rope_cache_;
  ParamGroupHooks hooks_;
  LayerCollectives collectives_;
  // A unit's memory may move between its uses (ParamGroup::move_storage: a device allocator that
  // frees it). The modules keep raw pointers for the kernels, so every one that points into a
  // group is recorded here as an offset and rebound from the group's buffers at the group's next
  // acquire when they moved -- one pointer comparison per use when they did not. (The other way,
  // modules looking their tensors up in the unit at every use, would touch every module's code
  // for what is, on the CPU, never a change.)
  struct GroupPointer {
    void* pointer;  // a module's float* or const float*
    bool is_const;
    bool gradient;
    int64_t offset;
  };
  std::vector<std::vector<GroupPointer>> group_pointers_;
  std::vector<std::pair<const float*, const float*>> bound_storage_;  // (params, grads) bound
  // Records every module pointer into a group (after the module tree or the gradients are made).
  void record_group_pointers();
  // Rebinds `group`'s module pointers if its buffers moved since they were bound.
  void rebind_if_moved(int64_t group);
  // A use of a group, bracketed for the hooks; under hooks (FSDP) the group's bf16 copies exist
  // only in flight too: written by the acquire (fills_compute_copies) or remade from the masters
  // it brought.
  void acquire(int64_t group, bool gradients, GroupReads reads = GroupReads::parameters);
  void release(int64_t group, GroupUseEnd end);
  // Under hooks: the prefetch's gather writes the copies the use reads, so they are resident from
  // here on.
  void prefetch(int64_t group, GroupReads reads = GroupReads::parameters);
  // Whether a use of `group` reading `reads` reads any of its bf16 copies.
  bool reads_copies(int64_t group, GroupReads reads) const;
  int64_t prefetched_ = -1;  // the group a prefetch is gathering, until its acquire

  // The activation arena and its views, sized for (batch_, seq_).
  int64_t batch_ = 0, seq_ = 0;
  int arena_threads_ = 0;
  Buffer arena_;
  Activations acts_;
  LayerCall call_;  // the current (batch_, seq_) call
  std::vector<int32_t> ids_, positions_, targets_, segment_starts_;
  // On a device, whose kernels read token rows in its memory: (4, N) int32, rows of ids_, targets_,
  // positions_ and segment_starts_ copied in at each forward (upload_token_rows). Empty on the CPU,
  // whose kernels read the vectors.
  Buffer token_rows_;
  enum class TokenRow { ids, targets, positions, segment_starts };
  const std::vector<int32_t>& host_tokens(TokenRow row) const;
  int32_t* device_tokens(TokenRow row) const;  // its row of token_rows_
  // Where the kernels read `row`: the vector itself on the CPU, else its row of token_rows_.
  const int32_t* kernel_tokens(TokenRow row) const;
  // Copies the rows into token_rows_ on a device (nothing on the CPU) and points call_'s positions
  // and segment starts at them.
  void upload_token_rows();
  // One process: the copies of the block in use, every block's made in turn in the same pages (the
  // largest block's bytes), committed from the first block's use on. Giving them back where no
  // block is in use (the loss, the embedding) lowered no peak -- the step peaks while a block runs,
  // its arena committed whole -- and the faults of fresh zeroed pages at the next block's rounding
  // took 35-125 ms of a bf16 `small` step on a 2-vCPU VM (2-5 %; at every block's release, 1.6 %
  // more).
  Buffer block_in_flight_;
  struct ComputeCopy {
    int64_t master_offset;  // the fp32 master's, in its group's parameters
    uint16_t* copy;         // in its group's compute copy (ParamGroup::compute_copy)
    uint16_t* bound;        // where the module reads it: `copy`, or its place in block_in_flight_
    const uint16_t** module_copy;  // the module's pointer, set to `bound`
    int64_t numel;
    int64_t group;
    // The fp32 master is read too: the tied embedding's lookup, and the experts LoRA adapts
    // (ExpertLora merges their masters; their copies go unread).
    bool master_read;
  };
  std::vector<ComputeCopy> compute_copies_;
  const float* master_of(const ComputeCopy& c) const;  // where its master lies now
  // hold_compute_copies: every group's copies sit in its own buffer and are the weights; nothing
  // rounds them again.
  bool copies_held_ = false;
  Buffer embedding_bf16_;  // (V, h) an untied embedding's held copy, when its lookup reads bf16
  // Rounds the fp32 master weights of `group`, or of every group (-1), into their bf16 copies
  // (each forward: the optimizer or a load may have changed them); `all`: false leaves the copies
  // the hooks' acquire fills.
  void refresh_compute_weights(int64_t group, bool all = true);
  // The load-balancing loss over all sparse layers of the last forward.
  int64_t n_sparse_layers_ = 0;
  // (2 E + 1): the tokens routed to each expert (E), the summed router probabilities (E) and the
  // router rows (1), this forward's or, with ForwardOptions::sum_router_statistics, summed over
  // its ranks.
  std::vector<double> router_statistics_;
  std::vector<float> aux_dprobs_;  // (E) its gradient on every row's probabilities
  // On a device, whose router kernels read it in its memory: aux_dprobs_'s room there (E floats,
  // made at the first forward that needs it). Empty on the CPU, whose kernels read the vector.
  Buffer aux_dprobs_device_;
  float* kernel_aux_dprobs();  // where the kernels read and load_balancing_grad writes it
  double aux_loss_ = 0.0;
  bool aux_grad_ = false;
  bool grad_ready_ = false;
  bool gradients_allocated_ = false;
  // Tensor parallel (the plan's TP degree above 1): this rank's vocabulary rows, whose reductions
  // set_layer_collectives binds; the embedding and the loss compute on them.
  int64_t tp_degree_ = 1;
  VocabShard vocab_shard_;
  // Expert parallel (the plan cuts the experts over ep_degree_ > 1 ranks): the arrived rows' room
  // every sparse layer shares while it runs, and what each activation set keeps of them (layers
  // sharing a set under activation checkpointing share it), carved in the arena and bound to the
  // sets at each carving.
  int64_t ep_degree_ = 1;
  ExpertParallelScratch ep_scratch_;
  std::vector<std::unique_ptr<ExpertParallelRows>> ep_rows_;
  void bind_expert_parallel_rows();
  // Sequence parallel (the plan's, under TP): the residual stream holds seq / tp_degree_ tokens of
  // each sequence (Activations::sequence).
  bool sequence_parallel_ = false;
  // Whether the sparse blocks run on the rank's sequence shard (EP x TP, with or without sequence
  // parallel), and this rank's tp index.
  bool sparse_on_shards_ = false;
  int64_t tp_index_ = 0;
  // Whether the plan cuts every expert's width over the TP group (TP without EP: torchtitan's
  // expert tensor parallel; SparseMoeBlock::tp_cut).
  bool experts_cut_by_tp_ = false;
  // A replicated parameter's gradient (count floats) that each rank computes on its part of the
  // rows it reads.
  struct PartialGrad {
    float* grad = nullptr;
    int64_t count = 0;
  };
  // Layer i's such gradients: its q/k norms under TP (its heads), its input and post-attention
  // norms under sequence parallel (its tokens), and under EP x TP its router (a sparse block runs
  // on the rank's sequence shard); empty on one rank. Frozen ones (null) are left out.
  std::vector<PartialGrad> partial_grads(size_t i) const;
  // Runs `backward` and sums over the TP group the gradients it gave `grads`, leaving what
  // earlier backwards accumulated as it was.
  void summing_partial_grads(const std::vector<PartialGrad>& grads,
                             const std::function<void()>& backward);
  // The load-balancing statistics of this micro-batch (router_statistics_'s counts and probability
  // sums): under EP x TP each TP rank routed its sequence shard, and their sum over the TP group is
  // the data-parallel rank's, as without TP (ForwardOptions::sum_router_statistics then sums over
  // the data-parallel ranks for the global loss).
  void reduce_router_statistics();
  ActivationCheckpointing checkpointing_;
  bool forward_only_ = false;
  bool lora_attached_ = false;  // attach_lora: Retention::lora
};

// What `overrides` would do to a DecoderLM of `args` computing in `compute_dtype`, with the same
// errors its constructor raises and then its check_kernel_constraints(batch, seq), without
// building it (titan plan checks a config this way): the report, and the loss kernel they leave
// bound to lm_head (what the arena's loss workspace is sized for).
struct DecoderLMOverrides {
  OverrideReport report;
  const KernelEntry* lm_head_loss = nullptr;
};
DecoderLMOverrides decoder_lm_overrides(const ModelArgs& args,
                                        const std::vector<OverrideRule>& overrides,
                                        DType compute_dtype, int64_t batch, int64_t seq);
// `bound`, the loss kernel [overrides] or a plugin bound to lm_head, or with none (null) the
// running device's default.
const LmHeadLossKernel& bound_lm_head_loss(const LmHeadLossKernel* bound);
// Tensor parallel cuts the lm_head along the vocabulary: a titan::Error naming `loss` (the kernel
// bound to lm_head) when it has no vocabulary-parallel form.
void require_vocab_parallel_loss(const KernelEntry& loss);

// The model registry's factory for every family DecoderLM computes (models/registry.cpp).
std::unique_ptr<CausalLM> make_decoder_lm(const ModelArgs& args,
                                          const std::vector<OverrideRule>& overrides,
                                          DType compute_dtype, Residency params,
                                          const ParallelizePlan& plan);

}  // namespace titan
