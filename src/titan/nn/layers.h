// The building blocks every model file composes: each a module with a fully qualified Hugging Face
// name, pointers into its parameter group's flat buffers, the kernels bound to its op slots, and
// a forward / backward pair with mirrored arguments. Activations are passed in by the caller
// (the model carves them out of one arena), so a block can be recomputed for activation
// checkpointing by calling forward again on the same views.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <functional>
#include <initializer_list>

#include "titan/dispatch/overrides.h"
#include "titan/dispatch/registry.h"
#include "titan/nn/expert_parallel.h"
#include "titan/nn/lora.h"
#include "titan/nn/param_group.h"
#include "titan/ops/gemv.h"
#include "titan/ops/moe.h"
#include "titan/ops/moe_stages.h"
#include "titan/ops/rope.h"
#include "titan/ops/vocab_shard.h"

namespace titan {

// Resolves a module's slot to its kernel after overrides (dispatch/overrides.h).
class KernelBinder {
 public:
  explicit KernelBinder(const std::vector<KernelSlot>& slots) : slots_(slots) {}
  const KernelEntry& bind(const std::string& module, OpKind kind) const;

 private:
  const std::vector<KernelSlot>& slots_;
};

// Room the linears of a call use besides their inputs and outputs, shared by all of them.
struct LinearScratch {
  // bf16 compute: the input rounded to bf16 (N x largest in_features) and, in a backward, the
  // output's gradient (N x largest out_features).
  uint16_t* x_bf16 = nullptr;
  uint16_t* dy_bf16 = nullptr;
};

// One layer's keys and values in a KV cache (infer/kv_cache.h), each (max_len, KV, hd): fp32, or
// bf16 (raw bits) rounded from the fp32 keys (after k_norm and RoPE) and values.
struct KvCacheView {
  DType dtype = DType::f32;
  void* keys = nullptr;
  void* values = nullptr;
};

// Tensor parallel's collective at the decoder layer's module boundaries (Megatron's f and g; the
// reductions torchtitan's RowwiseParallel outputs and ColwiseParallel input gradients imply):
// each block's row-wise output (o_proj's, down_proj's or the experts') holds a partial sum on
// every rank of the TP group, and so, in the backward, does the gradient of each block's input
// (its column-wise projections'). sum_partials(x, count) replaces x by the sum over the group.
// Without a group (one rank) it is not set and the layer calls nothing.
// all_reduce_max(x, count) replaces x by the elementwise maximum over the group: with
// sum_partials, the reductions the vocabulary-parallel loss takes (ops/vocab_shard.h). Both give
// every rank the same bits; every rank calls them in the same order with the same count. The
// model (DecoderLM) also sums with sum_partials the embedding's partial rows, the loss's partial
// d x and the replicated norms' gradients each rank computed on its part (q/k norms on its heads;
// under sequence parallel the layer norms and the final norm on its tokens).
//
// Sequence parallel (torchtitan's enable_sequence_parallel: Shard(1) on (B, S, h)) replaces the
// pair around each block: a rank holds S / tp consecutive tokens of every sequence of the residual
// stream, the block's input is gathered whole before it and its output's partial sums are
// reduce-scattered back to the ranks' tokens after it (and the reverse in the backward). Both take
// `parts` blocks of `count` floats per rank, one per sequence:
//   all_gather(in, out, count, parts):     in (parts, count) this rank's; out (parts, tp, count),
//                                          out[p][r] = rank r's in[p].
//   reduce_scatter(in, out, count, parts): in (parts, tp, count) this rank's partial sums; out
//                                          (parts, count), out[p] = the sum over the ranks of
//                                          their in[p][rank()].
// in and out do not overlap. Over a Communicator (distributed/communicator.h) each is one
// all_gather_async / reduce_scatter_sum_async with a CommPart per part (whole: out[p] or in[p],
// own: in[p] or out[p], counts: `count` for every rank), waited for at once. Unset without
// sequence parallel.
//
// all_to_all_v is expert parallel's exchange over the EP group (nn/expert_parallel.h: AllToAllV),
// which a sparse block calls when the model holds E / ep of its experts: once with each layer's
// per-expert row counts (i32), then with the rows (the inputs, f32 or bf16, there and the outputs
// back in the forward; dy rows and routing weights there, the inputs again, and dx rows and d
// weights back in the backward). Unset without expert parallel. The TP reductions and the EP
// exchange run over different groups of ranks.
//
// sum_statistics is sum_partials in fp64 over the same TP group: the router's load-balancing
// counts and probability sums when a sparse block runs on the ranks' sequence shards. Unset
// without TP.
struct LayerCollectives {
  std::function<void(float* x, int64_t count)> sum_partials;
  std::function<void(double* x, int64_t count)> sum_statistics;
  std::function<void(float* x, int64_t count)> all_reduce_max;
  std::function<void(const float* in, float* out, int64_t count, int64_t parts)> all_gather;
  std::function<void(const float* in, float* out, int64_t count, int64_t parts)> reduce_scatter;
  AllToAllV all_to_all_v;
};

// Sequence parallel's scratch, shared by every layer, and its degree (LayerCollectives).
struct SequenceShards {
  int64_t degree = 1;         // the TP degree: each rank holds seq / degree tokens of a sequence
  float* gathered = nullptr;  // (N, h) a column-parallel block's input gathered whole
  // (N, h) a row-parallel block's output, partial sums before their reduce-scatter; in the
  // backward the output's gradient gathered whole.
  float* partial = nullptr;
  // (N / degree, h) the block input's gradient, this rank's rows: may lie in `gathered`, whose
  // contents are dead by the time it is written (the block's backward has read them).
  float* d_rows = nullptr;
};

// EP x TP without sequence parallel (torchtitan's): a sparse block runs on this TP rank's shard of
// each sequence (seq / degree consecutive tokens from index x seq / degree), sliced from the
// whole, replicated input; its output rows are all-gathered whole (LayerCollectives::all_gather),
// and in the backward the whole output gradient is sliced and the input gradient's rows gathered.
// The rooms every sparse layer shares, (N / degree, h) each.
struct SparseBlockShard {
  int64_t degree = 1, index = 0;
  float* x = nullptr;   // the block's input rows
  float* y = nullptr;   // its output rows; in the backward the output gradient's
  float* dx = nullptr;  // the input gradient's rows
};

// Where one forward call of a layer reads and writes besides its parameters and activations.
// Training and evaluation run a batch of sequences whose keys and values are the call's own
// activations; KV-cached decode runs the new tokens of one sequence against a cache.
struct LayerCall {
  int64_t batch = 0, seq = 0;          // this call's tokens: batch x seq
  const int32_t* positions = nullptr;  // (batch * seq) absolute positions
  // (batch * seq) packed rows' segment starts (ops/attention.h), or null: one sequence per row.
  const int32_t* segment_start = nullptr;
  const RopeCache* rope = nullptr;
  // Decode (batch 1): this call's keys and values go to rows [past, past + seq) of the cache and
  // it attends over rows [0, past + seq). With a bf16 cache they are computed into the
  // activations' k and v (seq rows) first. Null keys: no cache, the activations' k and v.
  KvCacheView kv_cache;
  int64_t past = 0;
  const ExpertsScratch* experts_scratch = nullptr;  // a sparse layer's gathered rows
  LinearScratch linear;
  const LayerCollectives* collectives = nullptr;  // or null: one rank
  // Sequence parallel's scratch, or null: every rank holds every token of the residual stream.
  const SequenceShards* sequence_shards = nullptr;
  // Without it, under EP x TP, where the sparse blocks run on this rank's tokens; else null.
  const SparseBlockShard* sparse_shard = nullptr;

  int64_t tokens() const { return batch * seq; }
  // The residual stream's rows on this rank: tokens() / degree under sequence parallel.
  int64_t rows() const {
    return sequence_shards != nullptr ? tokens() / sequence_shards->degree : tokens();
  }
  // The sum over the tensor-parallel group of x (count) at a block boundary; nothing on one rank.
  void sum_partials(float* x, int64_t count) const {
    if (collectives && collectives->sum_partials) collectives->sum_partials(x, count);
  }
  // A column-parallel block's input (N, h) from this rank's rows of it (rows(), h): under sequence
  // parallel gathered into sequence_shards->gathered, else `rows` itself.
  const float* gather_block_input(const float* rows, int64_t h) const;
  // The gradient of a row-parallel block's output (N, h) from this rank's rows of it: under
  // sequence parallel gathered into sequence_shards->partial (the reduce-scatter's backward), else
  // `rows` itself.
  const float* gather_output_grad(const float* rows, int64_t h) const;
  // Where a row-parallel block writes its output (N, h): sequence_shards->partial under sequence
  // parallel, else `out` (this rank's rows: all of them).
  float* block_output(float* out) const {
    return sequence_shards != nullptr ? sequence_shards->partial : out;
  }
  // Where a block input's gradient, summed, lands (rows(), h): sequence_shards->d_rows under
  // sequence parallel (the all-gather's backward), else `d_whole` itself.
  float* input_grad_rows(float* d_whole) const {
    return sequence_shards != nullptr ? sequence_shards->d_rows : d_whole;
  }
  // out (rows(), h) = the group's sum of the partial sums `partial` (N, h) at this rank's rows:
  // reduce-scattered under sequence parallel, else summed in place (partial is out).
  void sum_block_output(float* out, float* partial, int64_t h) const;
  // rows (tokens() / degree, h) = sparse_shard's part of each sequence of whole (tokens(), h).
  void slice_sparse_rows(const float* whole, float* rows, int64_t h) const;
  // whole (tokens(), h) = every rank's sparse_shard rows (tokens() / degree, h), all-gathered.
  void gather_sparse_rows(const float* rows, float* whole, int64_t h) const;
};

struct Linear {
  std::string name;  // e.g. model.layers.0.self_attn.q_proj
  int64_t in_features = 0, out_features = 0;
  float* weight = nullptr;       // (out, in) the fp32 parameter
  float* weight_grad = nullptr;  // (out, in) or null
  float* bias = nullptr;         // (out), or null for bias=False
  float* bias_grad = nullptr;    // (out) or null
  // Whether the forward adds the bias. A row-wise part on a tensor-parallel rank but the first
  // does not: the ranks' partial outputs are summed, so the group adds it once. Its gradient (dy's
  // column sums, dy the same on every rank) is computed on every rank alike.
  bool adds_bias = true;
  // A bf16 copy of weight that the GEMMs use instead (mixed-precision training, bf16 inference),
  // or null. x and dy are rounded to bf16 too and products accumulate in fp32 (the kernel's bf16
  // form: a bf16 model binds no other).
  const uint16_t* weight_bf16 = nullptr;
  const LinearKernel* kernel = nullptr;
  std::string kernel_name;  // registry name
  // A LoRA update added to every product (nn/lora.h), or null.
  const LoraLinear* lora = nullptr;

  // What the forward multiplies by, as the decode GEMVs take it.
  GemvWeight compute_weight() const;
  // Whether the GEMMs take bf16 operands.
  bool computes_in_bf16() const;
  // y (N, out) = x (N, in) W^T + b. keep_x_bf16 (N, in), or null: where x's bf16 rounding is
  // kept for the backward (a linear that computes in bf16; linear_group_forward).
  void forward(float* y, const float* x, int64_t n, const LinearScratch& scratch,
               uint16_t* keep_x_bf16 = nullptr) const;
  // The same on x already rounded to bf16 (N, in): the linear must compute in bf16.
  void forward_bf16(float* y, const uint16_t* x_bf16, int64_t n) const;
  // Whether forward_to_bf16 can run: it computes in bf16, its kernel writes bf16 outputs and it
  // has no bias (which is added to the fp32 product before rounding).
  bool writes_bf16() const;
  // y (N, out) = x (N, in) W^T rounded to bf16 (raw bits), x already rounded.
  void forward_to_bf16(uint16_t* y, const uint16_t* x_bf16, int64_t n) const;
  // dx (N, in) = dy W (or += when accumulate_dx), dW += dy^T x, db += column sums of dy; x_bf16:
  // the rounding the forward kept, read instead of x (linear_group_backward).
  void backward(float* dx, const float* dy, const float* x, int64_t n, bool accumulate_dx,
                const LinearScratch& scratch, const uint16_t* x_bf16 = nullptr) const;
};

// One product of linear_group_forward.
struct LinearOutput {
  const Linear* linear = nullptr;
  float* y = nullptr;  // (N, out)
};

// One gradient of linear_group_backward.
struct LinearGrad {
  const Linear* linear = nullptr;
  const float* dy = nullptr;  // (N, out)
  // dy already rounded to bf16 (N, out), or null: the linear must compute in bf16 and have no
  // bias (its gradient sums dy in fp32); dy is then not read.
  const uint16_t* dy_bf16 = nullptr;
};

// y_i = x W_i^T + b_i for linears that share their input (q/k/v, gate/up). A one-token call whose
// linears are all bound to the built-in kernel runs as one fused GEMV over their weights (fp32 or
// bf16, ops/gemv.h) -- the decode path, bound by weight bytes; otherwise each linear's kernel
// runs, on x rounded to bf16 once for all of them when they compute in bf16. keep_x_bf16 (N, in),
// or null: that rounding goes there rather than to the scratch, so a backward reads it instead of
// x (mixed-precision training keeps the linears' inputs only in bf16); every linear must then
// compute in bf16.
void linear_group_forward(std::initializer_list<LinearOutput> outputs, const float* x, int64_t n,
                          const LinearScratch& scratch, uint16_t* keep_x_bf16 = nullptr);
// Its backward: dx (N, in) = sum_i dy_i W_i (overwritten, or added to when accumulate_dx), each
// dW_i and db_i accumulated; x is rounded to bf16 once for all of them when they compute in bf16,
// unless x_bf16, the rounding the forward kept, is given (x is then not read).
void linear_group_backward(std::initializer_list<LinearGrad> grads, float* dx, const float* x,
                           int64_t n, bool accumulate_dx, const LinearScratch& scratch,
                           const uint16_t* x_bf16 = nullptr);

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
  // (V, dim) raw bf16 bits read instead of `weight` when set (inference's embedding held in bf16:
  // infer/weights.h; the kernel's forward_bf16).
  const uint16_t* weight_bf16 = nullptr;
  const EmbeddingKernel* kernel = nullptr;
  // Tensor parallel: the vocabulary rows this rank holds (weight is (shard.rows, dim)), or null
  // (the whole vocabulary). The forward then writes this rank's partial rows (zero for ids it does
  // not hold), which the caller sums over the group; the backward scatters into the local rows.
  const VocabShard* vocab_shard = nullptr;

  void forward(float* out, const int32_t* ids, int64_t n) const;
  void backward(const float* dout, const int32_t* ids, int64_t n) const;
};

// Activations one self-attention module keeps for its backward (N = batch * seq tokens).
struct AttentionActivations {
  float* q_pre = nullptr;   // (N, H*hd) q_proj output, q_norm's input (with q/k norm)
  float* q_rstd = nullptr;  // (N*H) (with q/k norm)
  float* k_pre = nullptr;   // (N, KV*hd) (with q/k norm)
  float* k_rstd = nullptr;  // (N*KV) (with q/k norm)
  // q and k after their norms and RoPE. With q/k norm, training's backward makes them again
  // from q_pre and k_pre, so the caller may give every layer the same room for them.
  float* q = nullptr;    // (N, H, hd)
  float* k = nullptr;    // (N, KV, hd) (null with an fp32 cache)
  float* v = nullptr;    // (N, KV, hd) (null with an fp32 cache)
  float* out = nullptr;  // (N, H, hd) attention output, o_proj's input
  float* lse = nullptr;  // (B, H, S)
  // (N, h) the projections' input rounded to bf16, kept for their backward in bf16 training (the
  // caller's fp32 input is then scratch); null otherwise.
  uint16_t* x_bf16 = nullptr;
  // Inference on bf16 weights with a bf16 KV cache: (N, H, hd) room for q's bits, written where
  // q is rounded, which the attention kernel's bf16 forward reads with the cache's keys and
  // values as it holds them (a bf16 model multiplies bf16 q and k, and bf16 probabilities with
  // v, for a prompt and a decode step alike); null otherwise.
  uint16_t* q_bf16 = nullptr;
  // bf16 training: q_pre, k_pre, q, k and v (same shapes) rounded to bf16 where they are made, as
  // torch.autocast's bf16 projections return them and its attention matmuls read them, and out
  // rounded as o_proj reads it (autocast's attention returns it in bf16), kept so (raw bits); the
  // fp32 pointers above then name scratch every layer shares while the layer runs (with q/k norm,
  // so may q and k here: they are made again like the fp32 ones). An attention kernel with bf16
  // forms reads only the bits, so q, k and v there are left unrounded; one without reads the
  // fp32 values, rounded in place.
  // Null otherwise (and with a KV cache).
  struct Kept {
    uint16_t *q_pre = nullptr, *k_pre = nullptr, *q = nullptr, *k = nullptr, *v = nullptr,
             *out = nullptr;
  } kept;
};

struct AttentionGradScratch {
  float* dq = nullptr;    // (N, H*hd)
  float* dk = nullptr;    // (N, KV*hd)
  float* dv = nullptr;    // (N, KV*hd)
  float* dout = nullptr;  // (N, H*hd)
};

// Causal GQA self-attention as the Llama family computes it: q/k/v projections (biases optional:
// Qwen2), per-head q_norm/k_norm when qk_norm (Qwen3), RoPE, attention, o_proj.
struct SelfAttention {
  std::string name;  // model.layers.{i}.self_attn
  int64_t n_heads = 0, n_kv_heads = 0, head_dim = 0;
  Linear q_proj, k_proj, v_proj, o_proj;
  bool qk_norm = false;
  RMSNorm q_norm, k_norm;  // only with qk_norm
  const AttentionKernel* attention = nullptr;
  std::string attention_kernel;  // registry name, for error messages
  const RopeKernel* rope = nullptr;

  // y (N, h) = attention of x (N, h). With a cache in `call`, k and v go into its rows and the
  // queries attend over every cached row; else into act.k / act.v.
  void forward(float* y, AttentionActivations& act, const float* x, const LayerCall& call) const;
  // dx (N, h) = d y / d x given dy; parameter gradients accumulated (training calls only).
  void backward(float* dx, AttentionGradScratch& scratch, const float* dy,
                const AttentionActivations& act, const float* x, const LayerCall& call) const;
  AttentionShape shape(const LayerCall& call) const;
  // The attention kernel's constraint for this shape (titan::Error when broken).
  void check_constraints(const AttentionShape& shape) const;
};

// act is never kept: the backward recomputes it from gate and up, bit for bit, in scratch every
// layer shares. In bf16 training the backward reads bf16 roundings, as under torch.autocast, where
// gate_proj's and up_proj's outputs are bf16: the input, gate and up below are kept rounded, and
// act is computed from the rounded gate and up. gate and up are then fp32 scratch, and act_bf16
// bf16 scratch, that every layer shares (the forward computes there unless gate_proj and up_proj
// write bf16 themselves, the backward widens the kept values into it when the swiglu kernel has
// no bf16 forms). Otherwise the bf16 pointers are null and gate and up are kept.
struct MlpActivations {
  float* gate = nullptr;          // (N, I)
  float* up = nullptr;            // (N, I)
  float* act = nullptr;           // (N, I) silu(gate) * up, down_proj's input (scratch)
  uint16_t* x_bf16 = nullptr;     // (N, h) gate_proj's and up_proj's input
  uint16_t* gate_bf16 = nullptr;  // (N, I)
  uint16_t* up_bf16 = nullptr;    // (N, I)
  uint16_t* act_bf16 = nullptr;   // (N, I) act rounded, down_proj's input
};

struct MlpGradScratch {
  float* dgate = nullptr;  // (N, I)
  float* dup = nullptr;    // (N, I)
  float* dact = nullptr;   // (N, I)
  // (N, I) each, d gate and d up rounded, in the rooms of dgate and dup (bf16 training's swiglu
  // forms write these instead).
  uint16_t* dgate_bf16 = nullptr;
  uint16_t* dup_bf16 = nullptr;
};

// down_proj(silu(gate_proj(x)) * up_proj(x))
struct SwigluMlp {
  std::string name;  // model.layers.{i}.mlp
  int64_t hidden = 0, intermediate = 0;
  Linear gate_proj, up_proj, down_proj;
  const SwigluKernel* swiglu = nullptr;

  void forward(float* y, MlpActivations& act, const float* x, int64_t n,
               const LinearScratch& linear) const;
  void backward(float* dx, MlpGradScratch& scratch, const float* dy, const MlpActivations& act,
                const float* x, int64_t n, const LinearScratch& linear) const;
};

// Activations one sparse MoE block keeps for its backward (N tokens, E experts, top k).
struct MoeActivations {
  float* router_logits = nullptr;  // (N, E) mlp.gate output
  float* router_probs = nullptr;   // (N, E) softmax of the logits, fp32
  int32_t* topk_index = nullptr;   // (N, k) chosen experts, by descending probability
  float* topk_weight = nullptr;    // (N, k) their routing weights
  ExpertsActivations experts;      // N*k rows
  // Expert parallel: the exchange and the arrived rows' activations this set keeps (the experts'
  // gate and up above are then unused); null otherwise.
  ExpertParallelRows* expert_parallel = nullptr;
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
  // Their bf16 copies, or nulls: with them the experts compute in bf16 (mixed precision).
  ExpertWeightsBf16 weights_bf16;
  ExpertGrads grads;  // or nulls (frozen: LoRA's base)
  // LoRA on the experts (nn/lora.h), or null: they then compute with the merged weights.
  const ExpertLora* lora = nullptr;
  const RouterKernel* router = nullptr;  // mlp.gate's softmax and top-k
  // A fused kernel, or `experts_staged`: then after the router the block runs the three stage
  // slots below in turn (ops/moe_stages.h), each bound on its own (mlp.experts' moe_dispatch,
  // grouped_experts and moe_combine slots); a fused kernel replaces all three.
  const ExpertsKernel* experts = nullptr;
  std::string experts_kernel;  // registry name, for error messages
  const MoeDispatchKernel* dispatch = nullptr;
  const GroupedExpertsKernel* grouped = nullptr;
  const MoeCombineKernel* combine = nullptr;
  // Expert parallel (ep_degree > 1; the staged kernels only): `weights` and `grads` hold this
  // rank's n_experts / ep_degree experts, those from ep_rank * n_experts / ep_degree on, while the
  // router picks among all n_experts; the rows cross to the experts' ranks through the layer
  // collectives' all_to_all_v, and the arrived rows compute in `ep_scratch`.
  int64_t ep_rank = 0, ep_degree = 1;
  ExpertParallelScratch* ep_scratch = nullptr;
  // Expert tensor parallel (TP without EP, torchtitan's): `weights` and `grads` hold this TP rank's
  // columns of every expert's gate and up and the matching rows of down (`intermediate` is its
  // part), so the block runs on the whole rows, the router on every token, and its output and
  // input gradient are partial sums the TP group adds, as a dense TP MLP's.
  bool tp_cut = false;

  ExpertsShape shape(int64_t n) const;
  // Whether the experts' GEMMs take bf16 operands.
  bool computes_in_bf16() const { return weights_bf16.gate != nullptr; }
  // The experts kernel's constraint for n tokens (titan::Error when broken).
  void check_constraints(int64_t n) const;
  // y (N, h) from x (N, h); `scratch` is only used during the call. `collectives`: the layer's
  // (expert parallel's all_to_all_v), or null on one rank.
  void forward(float* y, MoeActivations& act, const ExpertsScratch& scratch, const float* x,
               int64_t n, const LayerCollectives* collectives = nullptr) const;
  // dx (N, h) = d y / d x given dy, parameter gradients accumulated (router included).
  // dprobs_all (E), optional: the load-balancing loss's gradient on every row's probabilities.
  void backward(float* dx, MoeGradScratch& scratch, const float* dy, const MoeActivations& act,
                const float* x, const float* dprobs_all, int64_t n,
                const LayerCollectives* collectives = nullptr) const;

 private:
  // Whether `experts` is the registry's experts_staged (compared by its forward function).
  bool staged() const;
  // The staged forward and backward under expert parallel (nn/expert_parallel.h): the stages of
  // the one-rank path with the arrived rows between dispatch and combine.
  void forward_expert_parallel(float* y, MoeActivations& act, const ExpertsScratch& s,
                               const float* x, int64_t n, const ExpertWeights& w,
                               const ExpertWeightsBf16& wb, const AllToAllV& all_to_all_v) const;
  void backward_expert_parallel(float* dx, MoeGradScratch& g, const float* dy,
                                const MoeActivations& act, const float* x, int64_t n,
                                const ExpertWeights& w, const ExpertWeightsBf16& wb,
                                const ExpertGrads& dw, const AllToAllV& all_to_all_v) const;
  // The grouped compute's shape over `rows` arrived rows of this rank's experts.
  ExpertsShape local_shape(int64_t rows) const;
};

}  // namespace titan
