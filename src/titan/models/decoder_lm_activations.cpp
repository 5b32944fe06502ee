// DecoderLM's activation tables: the training arena's, which sizes it (titan plan, from ModelArgs
// alone) and carves it into every layer's saved tensors, the backward's scratch and the loss's
// workspace; and an inference session's scratch (carve_inference), which keeps nothing.
#include <omp.h>

#include <algorithm>
#include <map>
#include <optional>

#include "titan/backend/backend.h"
#include "titan/core/carver.h"
#include "titan/core/error.h"
#include "titan/dispatch/registry.h"
#include "titan/models/decoder_lm.h"

namespace titan {

int64_t DecoderLM::carve_activations(const ModelArgs& args, DType compute_dtype,
                                     const Retention& retention, int64_t tp_degree,
                                     bool sequence_parallel, int64_t ep_degree,
                                     const LmHeadLossKernel& loss, float* base, int64_t batch,
                                     int64_t seq, Activations& v) {
  // A tensor-parallel rank's heads and MLP widths (the plan's column-wise parts); the residual
  // streams and norms whole, or under sequence parallel this rank's R = N / tp rows of them
  // (seq / tp tokens of each sequence), the blocks' inputs and outputs gathered whole into
  // scratch every layer shares.
  const bool sp = sequence_parallel && tp_degree > 1;
  TITAN_CHECK(!sp || seq % tp_degree == 0, "training.seq_len ", seq,
              " must be divisible by parallelism.tensor_parallel_degree ", tp_degree,
              " (sequence parallel gives each rank seq / degree tokens of every sequence)");
  const int64_t n = batch * seq, h = args.hidden_size, hd = args.head_dim;
  const int64_t R = sp ? n / tp_degree : n;
  const int64_t H = args.num_attention_heads / tp_degree, KV = args.num_key_value_heads / tp_degree;
  // A sparse block routes M rows: every token on one rank and under expert tensor parallel (TP
  // without EP: its experts' width Im cut over the TP ranks), under EP x TP the rank's sequence
  // shard to whole experts (R under sequence parallel; else sliced from the whole stream into
  // rooms of its own, sparse_shard).
  const bool experts_cut = tp_degree > 1 && ep_degree == 1;
  const int64_t I = args.intermediate_size / tp_degree;
  const int64_t Im = args.moe_intermediate_size / (experts_cut ? tp_degree : 1);
  const int64_t M = experts_cut ? n : n / tp_degree;
  const int64_t E = args.num_experts, k = args.num_experts_per_tok, rows = M * k;
  const int64_t n_layers = args.num_hidden_layers;
  int64_t n_sparse = 0;
  for (int64_t i = 0; i < n_layers; ++i) n_sparse += args.layer_is_sparse(i) ? 1 : 0;
  const bool any_sparse = n_sparse > 0, any_dense = n_sparse < n_layers;
  // One layer's set serves every layer that keeps nothing for its backward (its forward runs
  // again there), so it holds each kind of MLP those layers have.
  bool shared_sparse = false, shared_dense = false;
  for (int64_t i = 0; i < n_layers; ++i) {
    if (!retention.shares_set(i)) continue;
    shared_sparse = shared_sparse || args.layer_is_sparse(i);
    shared_dense = shared_dense || !args.layer_is_sparse(i);
  }
  // Selective "op", and a LoRA run under none: the layers keep no norm output (nor its bf16
  // rounding): one room for all, filled again in the backward (DecoderLayer::backward).
  const bool remake_norms = retention.remakes_norms();
  Carver c(base);
  // bf16 training keeps what the linears' backward reads as its bf16 rounding (their inputs) and
  // so does the dense MLP with gate and up (as torch.autocast keeps its saved tensors; the
  // product, computed from their roundings, is recomputed in the backward in both dtypes), and the
  // attention its q/k norms' inputs (else q and k) and v (rounded where they are made, as
  // autocast's bf16 projections and attention matmuls have them) and its output (as o_proj reads
  // it); the fp32
  // values are computed into scratch every layer shares. The attention's statistics stay fp32,
  // and so does the MoE block's input (its router computes in fp32); the experts kernel keeps its
  // rows' gate and up in bf16 (below), their product recomputed like the dense MLP's.
  const bool keep_bf16 = compute_dtype == DType::bf16;
  // The scratch the layers share, forward and backward, is idle while the lm_head loss runs, and
  // the loss's workspace is idle while a layer runs: both are carved from one region. (The
  // loss's dx is grad.d_norm and its rounded input linear.x_bf16: those stay outside.)
  const int64_t shared_begin = c.used();
  LayerGradScratch& g = v.grad;
  g.attn = {c.take(n * H * hd), c.take(n * KV * hd), c.take(n * KV * hd), c.take(n * H * hd)};
  if (any_dense) {
    g.mlp = {c.take(n * I), c.take(n * I), c.take(n * I)};
    g.mlp.dgate_bf16 = reinterpret_cast<uint16_t*>(g.mlp.dgate);
    g.mlp.dup_bf16 = reinterpret_cast<uint16_t*>(g.mlp.dup);
  }
  if (any_sparse) {
    // Under bf16 the room of the gathered rows also holds, past their bf16 values, the staged
    // backward's recomputed outputs (ExpertsScratch::out): (R, h) bf16 then (R, h) fp32.
    const int64_t rows_bf16 = (rows * h + 1) / 2, out_at = (rows_bf16 + 15) / 16 * 16;
    float* x_rows = c.take(keep_bf16 ? out_at + rows * h : rows * h);
    g.moe = {
        c.take(M * E),
        c.take(M * k),
        {x_rows, c.take(rows * h), c.take(rows * Im), c.take(rows * Im), c.take(rows * Im),
         c.take(rows), c.take(rows), keep_bf16 && x_rows != nullptr ? x_rows + out_at : nullptr}};
  }
  v.sparse_shard = SparseBlockShard{};
  if (any_sparse && tp_degree > 1 && !sp && !experts_cut) {
    TITAN_CHECK(seq % tp_degree == 0, "training.seq_len ", seq,
                " must be divisible by parallelism.tensor_parallel_degree ", tp_degree,
                " (under EP x TP a sparse block runs on seq / degree tokens of every sequence)");
    v.sparse_shard.degree = tp_degree;
    v.sparse_shard.x = c.take(M * h);
    v.sparse_shard.y = c.take(M * h);
    v.sparse_shard.dx = retention.forward_only ? nullptr : c.take(M * h);
  }
  float* norm_scratch = keep_bf16 || remake_norms ? c.take(R * h) : nullptr;
  // The blocks' inputs rounded whole when no layer keeps them so: made again in the backward from
  // the norms (remade, or under sequence parallel widened from this rank's kept rows and
  // gathered).
  uint16_t* norm_bf16_scratch =
      keep_bf16 && (remake_norms || sp) ? c.take<uint16_t>(n * h) : nullptr;
  // A dense MLP's product and the experts' are recomputed in the backward, never kept.
  float* mlp_act = any_dense ? c.take(n * I) : nullptr;
  float* experts_act = nullptr;
  if (any_sparse) {
    experts_act =
        keep_bf16 ? reinterpret_cast<float*>(c.take<uint16_t>(rows * Im)) : c.take(rows * Im);
  }
  const MlpActivations mlp_scratch =
      keep_bf16 && any_dense
          ? MlpActivations{c.take(n * I), c.take(n * I),          mlp_act, nullptr, nullptr,
                           nullptr,       c.take<uint16_t>(n * I)}
          : MlpActivations{};
  // With q/k norms, q and k after their norms and RoPE are recomputed in the backward from the
  // kept norm inputs (SelfAttention::backward), in both dtypes: one room for all layers.
  AttentionActivations attn_scratch;
  if (keep_bf16 || args.qk_norm) {
    attn_scratch.q = c.take(n * H * hd);
    attn_scratch.k = c.take(n * KV * hd);
  }
  if (keep_bf16) {
    if (args.qk_norm) {
      attn_scratch.q_pre = c.take(n * H * hd);
      attn_scratch.k_pre = c.take(n * KV * hd);
      attn_scratch.kept.q = c.take<uint16_t>(n * H * hd);
      attn_scratch.kept.k = c.take<uint16_t>(n * KV * hd);
    }
    attn_scratch.v = c.take(n * KV * hd);
    attn_scratch.out = c.take(n * H * hd);
  }
  const int64_t layers_end = c.used();
  c.rewind(shared_begin);
  const bool loss_bf16 = compute_dtype == DType::bf16;
  // Under TP the kernel has its vocabulary-parallel form (require_vocab_parallel_loss); a kernel
  // that sizes no workspace allocates its own (LmHeadLossKernel::workspace_bytes).
  if (tp_degree > 1) {
    const int64_t loss_bytes = loss.vocab_parallel_workspace_bytes(
        n, h, VocabShard::of(args.vocab_size, 0, static_cast<int>(tp_degree)), 0, loss_bf16);
    v.loss_workspace = c.take((loss_bytes + sizeof(float) - 1) / sizeof(float));
  } else if (loss.workspace_bytes != nullptr) {
    const int64_t loss_bytes = loss.workspace_bytes(n, h, args.vocab_size, 0, loss_bf16);
    v.loss_workspace = c.take((loss_bytes + sizeof(float) - 1) / sizeof(float));
  } else {
    v.loss_workspace = nullptr;
  }
  c.skip_past(layers_end);
  // The residual streams: each block's input and the last block's output, or, with nothing kept
  // for a backward, two in turn.
  const int64_t streams =
      retention.forward_only ? std::min<int64_t>(2, n_layers + 1) : n_layers + 1;
  std::vector<float*> stream(static_cast<size_t>(streams));
  for (float*& r : stream) r = c.take(R * h);
  v.resid.assign(n_layers + 1, nullptr);
  for (size_t i = 0; i < v.resid.size(); ++i) v.resid[i] = stream[i % stream.size()];
  // One layer's set, with the MLP kinds it serves.
  const auto carve_layer = [&](bool sparse, bool dense) {
    LayerActivations a;
    a.norms_remade = remake_norms;
    const auto take_norm_bf16 = [&] {
      return remake_norms || sp ? norm_bf16_scratch : c.take<uint16_t>(n * h);
    };
    // Sequence parallel's kept rounding of this rank's rows of a norm (LayerActivations).
    const auto take_rows_bf16 = [&] {
      return keep_bf16 && sp && !remake_norms ? c.take<uint16_t>(R * h) : nullptr;
    };
    a.norm1 = keep_bf16 || remake_norms ? norm_scratch : c.take(R * h);
    a.attn.x_bf16 = keep_bf16 ? take_norm_bf16() : nullptr;
    a.norm1_bf16 = take_rows_bf16();
    a.norm1_rstd = c.take(R);
    if (keep_bf16) {
      a.attn.q_pre = attn_scratch.q_pre;
      a.attn.k_pre = attn_scratch.k_pre;
      a.attn.q = attn_scratch.q;
      a.attn.k = attn_scratch.k;
      a.attn.v = attn_scratch.v;
      a.attn.out = attn_scratch.out;
      if (args.qk_norm) {
        a.attn.kept.q_pre = c.take<uint16_t>(n * H * hd);
        a.attn.kept.k_pre = c.take<uint16_t>(n * KV * hd);
        a.attn.kept.q = attn_scratch.kept.q;
        a.attn.kept.k = attn_scratch.kept.k;
      } else {
        a.attn.kept.q = c.take<uint16_t>(n * H * hd);
        a.attn.kept.k = c.take<uint16_t>(n * KV * hd);
      }
      a.attn.kept.v = c.take<uint16_t>(n * KV * hd);
      a.attn.kept.out = c.take<uint16_t>(n * H * hd);
    } else {
      if (args.qk_norm) {
        a.attn.q_pre = c.take(n * H * hd);
        a.attn.k_pre = c.take(n * KV * hd);
        a.attn.q = attn_scratch.q;
        a.attn.k = attn_scratch.k;
      } else {
        a.attn.q = c.take(n * H * hd);
        a.attn.k = c.take(n * KV * hd);
      }
      a.attn.v = c.take(n * KV * hd);
    }
    if (args.qk_norm) {
      a.attn.q_rstd = c.take(n * H);
      a.attn.k_rstd = c.take(n * KV);
    }
    if (!keep_bf16) a.attn.out = c.take(n * H * hd);
    a.attn.lse = c.take(batch * H * seq);
    a.resid_mid = c.take(R * h);
    // The router reads the MoE block's input in fp32, forward and backward.
    a.norm2 = (keep_bf16 && !sparse) || remake_norms ? norm_scratch : c.take(R * h);
    if (dense) a.norm2_bf16 = take_rows_bf16();
    a.norm2_rstd = c.take(R);
    if (dense && keep_bf16) {
      a.mlp = mlp_scratch;
      a.mlp.x_bf16 = take_norm_bf16();
      a.mlp.gate_bf16 = c.take<uint16_t>(n * I);
      a.mlp.up_bf16 = c.take<uint16_t>(n * I);
    } else if (dense) {
      a.mlp = {c.take(n * I), c.take(n * I), mlp_act};
    }
    if (sparse) {
      a.moe.router_logits = c.take(M * E);
      a.moe.router_probs = c.take(M * E);
      a.moe.topk_index = c.take<int32_t>(M * k);
      a.moe.topk_weight = c.take(M * k);
      // A bf16 experts kernel keeps gate and up as bf16 values (ops/moe.h).
      const auto take_kept = [&] {
        return keep_bf16 ? reinterpret_cast<float*>(c.take<uint16_t>(rows * Im))
                         : c.take(rows * Im);
      };
      float* gate = take_kept();
      float* up = take_kept();
      a.moe.experts = {gate, up, experts_act, c.take<int32_t>(rows), c.take<int32_t>(E + 1)};
    }
    return a;
  };
  // The shared set is carved where its first layer's own set would be: under none and full, the
  // order every arena has had.
  v.layers.assign(n_layers, {});
  std::optional<LayerActivations> shared;
  for (int64_t i = 0; i < n_layers; ++i) {
    if (!retention.shares_set(i)) {
      v.layers[i] = carve_layer(args.layer_is_sparse(i), !args.layer_is_sparse(i));
      continue;
    }
    if (!shared) shared = carve_layer(shared_sparse, shared_dense);
    v.layers[i] = *shared;
  }
  v.final_norm = c.take(R * h);
  v.final_norm_rstd = c.take(R);
  if (keep_bf16) {
    // The inputs rounded here are o_proj's and the lm_head's (the others are kept above); the
    // output gradients are every linear's.
    v.linear.x_bf16 = c.take<uint16_t>(n * std::max(h, H * hd));
    v.linear.dy_bf16 = c.take<uint16_t>(n * std::max({h, H * hd, any_dense ? I : 0}));
  }
  if (!retention.forward_only) {
    v.d_resid = c.take(R * h);
    g.d_norm = c.take(n * h);
  }
  v.sequence = SequenceShards{};
  if (sp) {
    v.sequence.degree = tp_degree;
    v.sequence.gathered = c.take(n * h);
    v.sequence.partial = c.take(n * h);
    // A block input's gradient is reduce-scattered there once the block's backward has read its
    // gathered input, and read (the norm's backward, the residual add) before the next gather;
    // the loss's d x once the loss has read the gathered final norm, and read by the final norm's
    // backward before any layer runs again.
    v.sequence.d_rows = retention.forward_only ? nullptr : v.sequence.gathered;
  }
  return c.used();
}

int64_t DecoderLM::carve_inference(const InferenceShape& shape, void* base,
                                   InferenceScratch& s) const {
  TITAN_CHECK(tp_degree_ == 1,
              "inference: the model holds tensor-parallel parts of its "
              "parameters, and inference under tensor parallel is not built yet");
  TITAN_CHECK(ep_degree_ == 1,
              "inference: the model holds expert-parallel parts of its experts, and inference "
              "under expert parallel is not built yet");
  const ModelArgs& a = args_;
  const int64_t n = shape.max_chunk, h = a.hidden_size, H = a.num_attention_heads;
  const int64_t qd = H * a.head_dim, kvd = a.num_key_value_heads * a.head_dim;
  const int64_t I = a.intermediate_size, E = a.num_experts, k = a.num_experts_per_tok;
  const int64_t Im = a.moe_intermediate_size, rows = n * k;  // rows: 0 for a dense model
  const int64_t qk = a.qk_norm ? 1 : 0;
  // bf16 weights: each GEMM's input rounded to bf16 (the widest input: h, H * hd or I).
  const int64_t bf16_in = shape.weights == DType::bf16 ? n * std::max({h, qd, I}) : 0;
  // A bf16 cache: this call's keys and values in fp32 before they are rounded into it (with an
  // fp32 cache k and v stay null: the layer writes them into the cache).
  const int64_t kv_in = shape.kv_cache == DType::bf16 ? n * kvd : 0;
  // bf16 weights and cache: q's bits for the bf16 attention.
  const int64_t q_bits = shape.kv_cache == DType::bf16 && shape.weights == DType::bf16 ? n * qd : 0;
  Carver c(base);
  s.resid = c.take(n * h);
  s.norm = c.take(n * h);
  s.rstd = c.take(n);
  LayerActivations& l = s.layer;
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
  s.experts.x = c.take(rows * h);
  s.experts.y = c.take(rows * h);
  s.logits = c.take(a.vocab_size);
  s.linear.x_bf16 = c.take<uint16_t>(bf16_in);
  return c.used();
}

int64_t DecoderLM::activation_bytes_of(const ModelArgs& args, DType compute_dtype,
                                       const ActivationCheckpointing& checkpointing, int64_t batch,
                                       int64_t seq, const ArenaLayout& layout) {
  const Retention retention{checkpointing, false, layout.lora};
  ExpertParallelScratch measured;
  return (arena_floats(args, compute_dtype, retention, layout.tp_degree, layout.sequence_parallel,
                       layout.ep_degree, bound_lm_head_loss(layout.lm_head_loss), batch, seq) +
          carve_expert_parallel(args, compute_dtype, retention, layout.ep_degree, layout.tp_degree,
                                nullptr, batch, seq, measured, nullptr)) *
         static_cast<int64_t>(sizeof(float));
}

int64_t DecoderLM::expert_parallel_bytes_of(const ModelArgs& args, DType compute_dtype,
                                            const ActivationCheckpointing& checkpointing,
                                            int64_t batch, int64_t seq, const ArenaLayout& layout) {
  const Retention retention{checkpointing, false, layout.lora};
  ExpertParallelScratch measured;
  return carve_expert_parallel(args, compute_dtype, retention, layout.ep_degree, layout.tp_degree,
                               nullptr, batch, seq, measured, nullptr) *
         static_cast<int64_t>(sizeof(float));
}

int64_t DecoderLM::carve_expert_parallel(const ModelArgs& args, DType compute_dtype,
                                         const Retention& retention, int64_t ep_degree,
                                         int64_t tp_degree, float* base, int64_t batch, int64_t seq,
                                         ExpertParallelScratch& scratch,
                                         std::vector<std::unique_ptr<ExpertParallelRows>>* sets) {
  if (ep_degree <= 1) return 0;
  const int64_t h = args.hidden_size, Im = args.moe_intermediate_size;
  // Each rank routes its tokens: under EP x TP its seq / tp tokens of each sequence.
  const int64_t tokens = batch * seq / tp_degree;
  const int64_t rows =
      most_arrived_rows(tokens, args.num_experts_per_tok, args.num_experts, ep_degree);
  // The sets carve_activations gives the sparse layers: each kept layer's own, and the one the
  // recomputed layers share.
  int64_t n_sets = 0;
  bool shared = false;
  for (int64_t i = 0; i < args.num_hidden_layers; ++i) {
    if (!args.layer_is_sparse(i)) continue;
    if (retention.shares_set(i)) {
      shared = true;
    } else {
      ++n_sets;
    }
  }
  n_sets += shared ? 1 : 0;
  // Under bf16 the arrived rows' inputs travel and the kept gate and up and their product are held
  // as bf16 values (as the arena's own rows: carve_activations); the rest stays fp32.
  const bool bf16 = compute_dtype == DType::bf16;
  Carver c(base);
  const auto take_values = [&](int64_t count) {
    return bf16 ? reinterpret_cast<float*>(c.take<uint16_t>(count)) : c.take(count);
  };
  scratch.rows = rows;
  scratch.x = take_values(rows * h);
  scratch.y = c.take(rows * h);
  scratch.act = take_values(rows * Im);
  scratch.dgate = c.take(rows * Im);
  scratch.dup = c.take(rows * Im);
  scratch.dact = c.take(rows * Im);
  scratch.w_rows = c.take(rows);
  scratch.dweight_rows = c.take(rows);
  scratch.out = bf16 ? c.take(rows * h) : nullptr;
  scratch.staging = c.take(rows * h);  // the widest row the exchange moves: h fp32
  if (sets != nullptr) sets->clear();
  for (int64_t i = 0; i < n_sets; ++i) {
    float* gate = take_values(rows * Im);
    float* up = take_values(rows * Im);
    if (sets == nullptr) continue;
    sets->push_back(std::make_unique<ExpertParallelRows>());
    sets->back()->gate = gate;
    sets->back()->up = up;
    sets->back()->rows = rows;
  }
  return c.used();
}

int64_t DecoderLM::arena_floats(const ModelArgs& args, DType compute_dtype,
                                const Retention& retention, int64_t tp_degree,
                                bool sequence_parallel, int64_t ep_degree,
                                const LmHeadLossKernel& loss, int64_t batch, int64_t seq) {
  Activations measured;
  return carve_activations(args, compute_dtype, retention, tp_degree, sequence_parallel, ep_degree,
                           loss, nullptr, batch, seq, measured);
}

int64_t DecoderLM::activation_bytes(int64_t batch, int64_t seq) const {
  ExpertParallelScratch measured;
  return (arena_floats(args_, compute_dtype_, retention(), tp_degree_, sequence_parallel_,
                       ep_degree_, *lm_head_loss_, batch, seq) +
          carve_expert_parallel(args_, compute_dtype_, retention(), ep_degree_, tp_degree_, nullptr,
                                batch, seq, measured, nullptr)) *
         static_cast<int64_t>(sizeof(float));
}

void DecoderLM::ensure_activations(int64_t batch, int64_t seq) {
  // Under bf16 the loss's workspace holds rows per OpenMP thread.
  const int threads = omp_get_max_threads();
  if (batch == batch_ && seq == seq_ && threads == arena_threads_) return;
  const int64_t n = batch * seq;
  arena_ = Buffer();  // release the old arena before taking the new one
  arena_ = Buffer(backend().memory(), static_cast<size_t>(activation_bytes(batch, seq)),
                  MemCategory::activations);
  const int64_t layers_floats =
      carve_activations(args_, compute_dtype_, retention(), tp_degree_, sequence_parallel_,
                        ep_degree_, *lm_head_loss_, arena_.as<float>(), batch, seq, acts_);
  carve_expert_parallel(args_, compute_dtype_, retention(), ep_degree_, tp_degree_,
                        arena_.as<float>() + layers_floats, batch, seq, ep_scratch_, &ep_rows_);
  batch_ = batch;
  seq_ = seq;
  arena_threads_ = threads;
  ids_.resize(n);
  targets_.resize(n);
  positions_.resize(n);
  token_rows_ = Buffer();
  if (&backend().memory() != &host_memory()) {
    token_rows_ = Buffer(backend().memory(), 4 * static_cast<size_t>(n) * sizeof(int32_t),
                         MemCategory::activations);
  }
  for (int64_t b = 0; b < batch; ++b) {
    for (int64_t s = 0; s < seq; ++s) positions_[b * seq + s] = static_cast<int32_t>(s);
  }
  if (rope_cache_.max_positions < seq) rope_cache_ = device_ops().rope_cache(args_.rope(), seq);
  call_ = LayerCall{};
  call_.batch = batch;
  call_.seq = seq;
  call_.positions = positions_.data();
  call_.rope = &rope_cache_;
  call_.experts_scratch = &acts_.grad.moe.experts;
  call_.linear = acts_.linear;
  call_.collectives = &collectives_;
  call_.sequence_shards = sequence_parallel_ ? &acts_.sequence : nullptr;
  acts_.sparse_shard.index = tp_index_;
  call_.sparse_shard = acts_.sparse_shard.degree > 1 ? &acts_.sparse_shard : nullptr;
  if (ep_degree_ > 1) bind_expert_parallel_rows();
}

void DecoderLM::bind_expert_parallel_rows() {
  std::map<const float*, ExpertParallelRows*> of_set;  // by the set's router logits
  size_t next = 0;
  for (size_t i = 0; i < m_.layers.size(); ++i) {
    if (!m_.layers[i].sparse) continue;
    MoeActivations& a = acts_.layers[i].moe;
    ExpertParallelRows*& rows = of_set[a.router_logits];
    if (rows == nullptr) {
      TITAN_CHECK(next < ep_rows_.size(), "expert parallel: more activation sets than the ",
                  ep_rows_.size(), " carve_expert_parallel carved");
      rows = ep_rows_[next++].get();
    }
    a.expert_parallel = rows;
  }
  TITAN_CHECK(next == ep_rows_.size(), "expert parallel: ", next, " activation sets, ",
              ep_rows_.size(), " carved");
}

void DecoderLM::set_row_segments(const int32_t* segment_start) {
  const int64_t n = batch_ * seq_;
  if (segment_start == nullptr) {
    if (call_.segment_start == nullptr) return;  // positions are still 0..seq-1
    for (int64_t i = 0; i < n; ++i) positions_[i] = static_cast<int32_t>(i % seq_);
    call_.segment_start = nullptr;
    return;
  }
  segment_starts_.assign(segment_start, segment_start + n);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t start = segment_starts_[i];
    TITAN_CHECK(start >= 0 && start <= i % seq_, "forward: packed row ", i / seq_, ", token ",
                i % seq_, " has segment start ", start, ", past its own position");
    positions_[i] = static_cast<int32_t>(i % seq_ - start);
  }
  call_.segment_start = segment_starts_.data();
}

const std::vector<int32_t>& DecoderLM::host_tokens(TokenRow row) const {
  const std::vector<int32_t>* rows[] = {&ids_, &targets_, &positions_, &segment_starts_};
  return *rows[static_cast<int>(row)];
}

int32_t* DecoderLM::device_tokens(TokenRow row) const {
  return token_rows_.as<int32_t>() + static_cast<int64_t>(row) * batch_ * seq_;
}

const int32_t* DecoderLM::kernel_tokens(TokenRow row) const {
  return token_rows_.data() == nullptr ? host_tokens(row).data() : device_tokens(row);
}

void DecoderLM::upload_token_rows() {
  if (token_rows_.data() == nullptr) return;  // the CPU's kernels read the vectors
  std::vector<TokenRow> rows = {TokenRow::ids, TokenRow::targets, TokenRow::positions};
  if (call_.segment_start != nullptr) rows.push_back(TokenRow::segment_starts);
  for (const TokenRow row : rows) {
    backend().copy_from_host(device_tokens(row), host_tokens(row).data(),
                             static_cast<size_t>(batch_ * seq_) * sizeof(int32_t));
  }
  call_.positions = device_tokens(TokenRow::positions);
  if (call_.segment_start != nullptr) call_.segment_start = device_tokens(TokenRow::segment_starts);
}

}  // namespace titan
