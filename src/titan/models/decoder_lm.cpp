#include "titan/models/decoder_lm.h"

#include <algorithm>
#include <cstring>
#include <string_view>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/dispatch/device_ops.h"
#include "titan/models/decoder_lm_slots.h"
#include "titan/models/parallelize.h"
#include "titan/models/state_dict_adapter.h"

namespace titan {
namespace {

std::string layer_name(int64_t i) {
  return "model.layers." + std::to_string(i);
}

// A linear module over `name`.weight, and `name`.bias when the group has one, its features those
// of the rank's part of the weight (out, in).
Linear make_linear(const std::string& name, const ParamGroup& g, const KernelBinder& binder) {
  Linear l;
  l.name = name;
  const ParamView& weight = g.view(name + ".weight");
  l.out_features = weight.spec.shape[0];
  l.in_features = weight.spec.shape[1];
  l.weight = g.params() + weight.offset;
  if (const ParamView* bias = g.find(name + ".bias")) l.bias = g.params() + bias->offset;
  const KernelEntry& kernel = binder.bind(name, OpKind::linear);
  l.kernel = &std::get<LinearKernel>(kernel.impl);
  l.kernel_name = kernel.name;
  return l;
}

// Points a linear module at its gradient views (none in a frozen group).
void bind_linear_grads(Linear& l, const ParamGroup& g) {
  if (g.grads() == nullptr) return;
  l.weight_grad = g.grads() + g.view(l.name + ".weight").offset;
  if (const ParamView* bias = g.find(l.name + ".bias")) l.bias_grad = g.grads() + bias->offset;
}

RMSNorm make_norm(const std::string& name, const ParamGroup& g, const KernelBinder& binder,
                  int64_t dim, double eps) {
  RMSNorm n;
  n.name = name;
  n.dim = dim;
  n.eps = static_cast<float>(eps);
  n.weight = g.params() + g.view(name + ".weight").offset;
  n.kernel = &std::get<RmsNormKernel>(binder.bind(name, OpKind::rms_norm).impl);
  return n;
}

}  // namespace

DecoderLM::DecoderLM(const ModelArgs& args, const std::vector<OverrideRule>& overrides,
                     DType compute_dtype, Residency params, const ParallelizePlan& plan)
    : args_(args), compute_dtype_(compute_dtype) {
  validate_model_args(args_, "model");
  TITAN_CHECK(compute_dtype == DType::f32 || compute_dtype == DType::bf16, "model: compute in ",
              dtype_name(compute_dtype), " is not supported (F32 or BF16)");
  slots_ = decoder_lm_default_slots(args_, compute_dtype_, backend().kind());
  override_report_ = apply_overrides(slots_, overrides, kernel_registry());
  const KernelBinder binder(slots_);
  const int64_t h = args_.hidden_size, hd = args_.head_dim;

  // The modules take their sizes from the rank's parts of their parameters: under a plan that
  // cuts them, the local heads, widths and vocabulary.
  const ParallelAxes& axes = plan.axes();
  bool cut_by_ep = false;
  for (ParamGroupSpec& g : local_param_specs(args_, plan)) {
    for (const ParamSpec& p : g.params) {
      cut_by_ep |= plan.style_of(module_of_param(p.name)) == ParallelStyle::expert &&
                   plan.placement_of(p).count > 1;
    }
    // bf16 units in flight (FSDP): the weights read only in bf16 last, so the fp32 masters a unit
    // in flight commits (FullyShardedGroups) lie together at the start of its buffer.
    if (compute_dtype_ == DType::bf16 && params == Residency::released) {
      std::stable_partition(g.params.begin(), g.params.end(),
                            [](const ParamSpec& p) { return !read_only_in_bf16(p.name); });
    }
    groups_.emplace_back(g.name, g.params, params);
  }

  tp_degree_ = axes.tp_degree;
  ep_degree_ = cut_by_ep ? axes.ep_degree : 1;
  sequence_parallel_ = tp_degree_ > 1 && axes.sequence_parallel;
  // Under TP a sparse block runs on the rank's sequence shard with whole experts spread over the
  // EP group (torchtitan's EP x TP), or without EP on the whole rows with the rank's part of every
  // expert's width (torchtitan's expert tensor parallel).
  experts_cut_by_tp_ = tp_degree_ > 1 && args_.is_moe() && ep_degree_ == 1;
  sparse_on_shards_ = tp_degree_ > 1 && args_.is_moe() && ep_degree_ > 1;
  tp_index_ = axes.tp_index;
  if (tp_degree_ > 1) {
    vocab_shard_ = VocabShard::of(args_.vocab_size, static_cast<int>(axes.tp_index),
                                  static_cast<int>(tp_degree_));
  }

  head_group_ = head_group_index(args_);
  const ParamGroup &g0 = groups_[0], &head = groups_[static_cast<size_t>(head_group_)];
  Embedding& embed = m_.embed_tokens;
  embed.name = "model.embed_tokens";
  const ParamView& embed_weight = g0.view("model.embed_tokens.weight");
  embed.vocab = embed_weight.spec.shape[0];
  embed.dim = h;
  embed.weight = g0.params() + embed_weight.offset;
  const KernelEntry& embed_kernel = binder.bind("model.embed_tokens", OpKind::embedding);
  embed.kernel = &std::get<EmbeddingKernel>(embed_kernel.impl);
  m_.norm = make_norm("model.norm", head, binder, h, args_.rms_norm_eps);
  // The training loss runs the lm_head inside its kernel; this module serves inference, whose
  // one-token logits are a GEMV on the device's default linear kernel.
  Linear& lm_head = m_.lm_head;
  lm_head.name = "lm_head";
  lm_head.in_features = h;
  const ParamView& lm_head_weight =
      args_.tie_word_embeddings ? embed_weight : head.view("lm_head.weight");
  lm_head.out_features = lm_head_weight.spec.shape[0];
  lm_head.weight = (args_.tie_word_embeddings ? g0 : head).params() + lm_head_weight.offset;
  const KernelEntry& builtin_linear = kernel_registry().get(
      kernel_registry().default_kernel(OpKind::linear, backend().kind()), OpKind::linear);
  lm_head.kernel = &std::get<LinearKernel>(builtin_linear.impl);
  lm_head.kernel_name = builtin_linear.name;
  const KernelEntry& loss_kernel = binder.bind("lm_head", OpKind::lm_head_loss);
  lm_head_loss_ = &std::get<LmHeadLossKernel>(loss_kernel.impl);
  if (tp_degree_ > 1) {
    // Tensor parallel: the embedding and the loss on this rank's vocabulary rows.
    TITAN_CHECK(embed.kernel->forward_vocab_parallel != nullptr, "model: embedding kernel '",
                embed_kernel.name, "' of model.embed_tokens has no vocabulary-parallel form ",
                "(tensor parallel cuts the embedding along the vocabulary)");
    require_vocab_parallel_loss(loss_kernel);
    embed.vocab_shard = &vocab_shard_;
  }

  for (int64_t i = 0; i < args_.num_hidden_layers; ++i) {
    const ParamGroup& g = groups_[static_cast<size_t>(layer_group_index(i))];
    const std::string p = layer_name(i);
    DecoderLayer layer;
    layer.name = p;
    layer.input_layernorm = make_norm(p + ".input_layernorm", g, binder, h, args_.rms_norm_eps);
    SelfAttention& at = layer.self_attn;
    at.name = p + ".self_attn";
    at.head_dim = hd;
    at.q_proj = make_linear(at.name + ".q_proj", g, binder);
    at.k_proj = make_linear(at.name + ".k_proj", g, binder);
    at.v_proj = make_linear(at.name + ".v_proj", g, binder);
    at.o_proj = make_linear(at.name + ".o_proj", g, binder);
    // Row-wise (o_proj, down_proj): the first TP rank adds the bias to the group's sum.
    at.o_proj.adds_bias = axes.tp_index == 0;
    at.n_heads = at.q_proj.out_features / hd;
    at.n_kv_heads = at.k_proj.out_features / hd;
    at.qk_norm = args_.qk_norm;
    if (at.qk_norm) {
      at.q_norm = make_norm(at.name + ".q_norm", g, binder, hd, args_.rms_norm_eps);
      at.k_norm = make_norm(at.name + ".k_norm", g, binder, hd, args_.rms_norm_eps);
    }
    const KernelEntry& attention = binder.bind(at.name, OpKind::attention);
    at.attention = &std::get<AttentionKernel>(attention.impl);
    at.attention_kernel = attention.name;
    at.rope = &std::get<RopeKernel>(binder.bind(at.name, OpKind::rope).impl);
    layer.post_attention_layernorm =
        make_norm(p + ".post_attention_layernorm", g, binder, h, args_.rms_norm_eps);
    layer.sparse = args_.layer_is_sparse(i);
    n_sparse_layers_ += layer.sparse ? 1 : 0;
    if (layer.sparse) {
      SparseMoeBlock& moe = layer.moe;
      moe.name = p + ".mlp";
      moe.hidden = h;
      moe.top_k = args_.num_experts_per_tok;
      moe.norm_topk_prob = args_.norm_topk_prob;
      moe.gate = make_linear(moe.name + ".gate", g, binder);
      moe.n_experts = moe.gate.out_features;
      moe.intermediate = g.view(moe.name + ".experts.gate_proj").spec.shape[1];
      const auto stacked = [&](const char* proj) {
        return g.params() + g.view(moe.name + ".experts." + proj).offset;
      };
      moe.weights = {stacked("gate_proj"), stacked("up_proj"), stacked("down_proj")};
      moe.router = &std::get<RouterKernel>(binder.bind(moe.name + ".gate", OpKind::router).impl);
      const KernelEntry& experts = binder.bind(moe.name + ".experts", OpKind::experts);
      moe.experts = &std::get<ExpertsKernel>(experts.impl);
      moe.experts_kernel = experts.name;
      const auto stage = [&](OpKind kind) {
        return &binder.bind(moe.name + ".experts", kind).impl;
      };
      moe.dispatch = &std::get<MoeDispatchKernel>(*stage(OpKind::moe_dispatch));
      moe.grouped = &std::get<GroupedExpertsKernel>(*stage(OpKind::grouped_experts));
      moe.combine = &std::get<MoeCombineKernel>(*stage(OpKind::moe_combine));
      moe.tp_cut = experts_cut_by_tp_;
      if (ep_degree_ > 1) {
        moe.ep_rank = axes.ep_index;
        moe.ep_degree = ep_degree_;
        moe.ep_scratch = &ep_scratch_;
      }
    } else {
      SwigluMlp& mlp = layer.mlp;
      mlp.name = p + ".mlp";
      mlp.hidden = h;
      mlp.gate_proj = make_linear(mlp.name + ".gate_proj", g, binder);
      mlp.up_proj = make_linear(mlp.name + ".up_proj", g, binder);
      mlp.down_proj = make_linear(mlp.name + ".down_proj", g, binder);
      mlp.down_proj.adds_bias = axes.tp_index == 0;
      mlp.intermediate = mlp.gate_proj.out_features;
      mlp.swiglu = &std::get<SwigluKernel>(binder.bind(mlp.name, OpKind::swiglu).impl);
    }
    m_.layers.push_back(std::move(layer));
  }
  if (compute_dtype_ == DType::bf16) allocate_compute_weights(params);
  record_group_pointers();
}

void DecoderLM::set_layer_collectives(LayerCollectives collectives) {
  collectives_ = std::move(collectives);
  vocab_shard_.all_reduce_sum = collectives_.sum_partials;
  vocab_shard_.all_reduce_max = collectives_.all_reduce_max;
}

void DecoderLM::initialize(uint64_t seed) {
  initialize_param_groups(groups_, args_, seed);
}

void DecoderLM::allocate_gradients() {
  TITAN_CHECK(!copies_held_, "model: gradients of a model whose bf16 copies are its weights");
  for (ParamGroup& g : groups_) g.allocate_gradients();
  gradients_allocated_ = true;
  // Point every module at its gradient view (null in a frozen group: LoRA's base).
  const auto grad_of = [](const ParamGroup& g, const std::string& param) -> float* {
    if (g.grads() == nullptr) return nullptr;
    return g.grads() + g.view(param).offset;
  };
  const ParamGroup &g0 = groups_[0], &head = groups_[static_cast<size_t>(head_group_)];
  m_.embed_tokens.weight_grad = grad_of(g0, "model.embed_tokens.weight");
  m_.norm.weight_grad = grad_of(head, "model.norm.weight");
  m_.lm_head.weight_grad =
      args_.tie_word_embeddings ? m_.embed_tokens.weight_grad : grad_of(head, "lm_head.weight");
  for (size_t i = 0; i < m_.layers.size(); ++i) {
    const ParamGroup& g = groups_[static_cast<size_t>(layer_group_index(static_cast<int64_t>(i)))];
    DecoderLayer& l = m_.layers[i];
    for (RMSNorm* n : {&l.input_layernorm, &l.post_attention_layernorm}) {
      n->weight_grad = grad_of(g, n->name + ".weight");
    }
    if (l.self_attn.qk_norm) {
      for (RMSNorm* n : {&l.self_attn.q_norm, &l.self_attn.k_norm}) {
        n->weight_grad = grad_of(g, n->name + ".weight");
      }
    }
    for (Linear* lin :
         {&l.self_attn.q_proj, &l.self_attn.k_proj, &l.self_attn.v_proj, &l.self_attn.o_proj}) {
      bind_linear_grads(*lin, g);
    }
    if (l.sparse) {
      SparseMoeBlock& moe = l.moe;
      bind_linear_grads(moe.gate, g);
      moe.grads = {grad_of(g, moe.name + ".experts.gate_proj"),
                   grad_of(g, moe.name + ".experts.up_proj"),
                   grad_of(g, moe.name + ".experts.down_proj")};
      continue;
    }
    for (Linear* lin : {&l.mlp.gate_proj, &l.mlp.up_proj, &l.mlp.down_proj}) {
      bind_linear_grads(*lin, g);
    }
  }
  record_group_pointers();
}

void DecoderLM::attach_lora(const LoraAdapter& adapter) {
  TITAN_CHECK(!gradients_allocated_, "model: LoRA attached after its gradients were allocated");
  TITAN_CHECK(ep_degree_ == 1 || adapter.experts().empty(),
              "model: LoRA on the experts under expert parallel is not built yet");
  TITAN_CHECK(!hooks_.acquire, "model: LoRA attached after FSDP sharded it (attach it first: ",
              "its groups are frozen before they are sharded)");
  for (DecoderLayer& layer : m_.layers) {
    for (Linear* lin : {&layer.self_attn.q_proj, &layer.self_attn.k_proj, &layer.self_attn.v_proj,
                        &layer.self_attn.o_proj, &layer.mlp.gate_proj, &layer.mlp.up_proj,
                        &layer.mlp.down_proj}) {
      const LoraLinear* l = adapter.find(lin->name);
      if (l == nullptr) continue;
      // Under tensor parallel the adapter must be cut by the model's plan (models/lora.h).
      TITAN_CHECK(l->in_features == lin->in_features && l->out_features == lin->out_features,
                  "model: the LoRA pair of ", lin->name, " is (", l->out_features, ", ",
                  l->in_features, ") and the linear (", lin->out_features, ", ", lin->in_features,
                  "): the adapter was not cut by the model's tensor-parallel plan");
      lin->lora = l;
    }
    if (!layer.sparse) continue;
    const ExpertLora* experts = adapter.find_experts(layer.moe.name + ".experts");
    layer.moe.lora = experts;
    if (experts == nullptr) continue;
    // The adapted stacked weights are read through their fp32 masters (ExpertLora merges them),
    // never through their bf16 copies (the merged weights are rounded instead): FSDP gathers them
    // in fp32.
    ExpertWeightsBf16& copies = layer.moe.weights_bf16;
    for (ComputeCopy& c : compute_copies_) {
      const bool gate_up = c.module_copy == &copies.gate || c.module_copy == &copies.up;
      if ((gate_up && experts->gate_up.rank > 0) ||
          (c.module_copy == &copies.down && experts->down.rank > 0)) {
        c.master_read = true;
      }
    }
  }
  for (ParamGroup& g : groups_) g.freeze();
  lora_attached_ = true;
  arena_ = Buffer();
  batch_ = seq_ = 0;  // the arena is re-carved on the next forward (Retention::lora)
}

void DecoderLM::set_activation_checkpointing(const ActivationCheckpointing& checkpointing) {
  TITAN_CHECK(
      checkpointing.mode != ActivationCheckpointing::Mode::layers || checkpointing.every > 0,
      "model: selective activation checkpointing of every ", checkpointing.every,
      "-th layer (N must be positive)");
  if (checkpointing == checkpointing_) return;
  checkpointing_ = checkpointing;
  arena_ = Buffer();
  batch_ = seq_ = 0;  // the arena is re-carved on the next forward
}

void DecoderLM::set_forward_only() {
  forward_only_ = true;
  arena_ = Buffer();
  batch_ = seq_ = 0;
}

void DecoderLM::layer_forward(size_t i, LayerActivations& a) {
  m_.layers[i].forward(acts_.resid[i + 1], a, acts_.resid[i], call_);
}

CrossEntropyResult DecoderLM::forward(const int32_t* input_ids, const int32_t* labels,
                                      int64_t batch, int64_t seq, const ForwardOptions& options) {
  TITAN_CHECK(batch > 0 && seq > 0, "forward: batch (", batch, ") and seq (", seq,
              ") must be positive");
  TITAN_CHECK(tp_degree_ == 1 || (collectives_.sum_partials && collectives_.all_reduce_max),
              "forward: the model holds tensor-parallel parts of its parameters, and its group's ",
              "reductions are not set (set_layer_collectives: sum_partials and all_reduce_max)");
  TITAN_CHECK(ep_degree_ == 1 || collectives_.all_to_all_v, "forward: the model holds ",
              "expert-parallel parts of its experts, and its group's all-to-all is not set ",
              "(set_layer_collectives: all_to_all_v)");
  TITAN_CHECK(!sparse_on_shards_ || (collectives_.sum_statistics && collectives_.all_gather),
              "forward: the model's sparse blocks run on sequence shards, and its group's ",
              "sum_statistics and all_gather are not set (set_layer_collectives)");
  TITAN_CHECK(!sequence_parallel_ || (collectives_.all_gather && collectives_.reduce_scatter),
              "forward: the model computes with sequence parallel, and its group's all_gather and ",
              "reduce_scatter are not set (set_layer_collectives)");
  TITAN_CHECK(seq <= args_.max_position_embeddings, "forward: sequence length ", seq,
              " exceeds max_position_embeddings ", args_.max_position_embeddings);
  TITAN_CHECK(!options.compute_grad || gradients_allocated_,
              "forward with compute_grad before allocate_gradients");
  TITAN_CHECK(!options.compute_grad || !forward_only_,
              "forward with compute_grad on a model made forward-only");
  ensure_activations(batch, seq);
  set_row_segments(options.segment_start);
  // Under hooks each group's copies are made at its acquire; in one process the blocks' are too,
  // and the head's here.
  if (!hooks_.acquire && !compute_copies_.empty() && !copies_held_) {
    groups_[static_cast<size_t>(head_group_)].acquire_compute_copy();
    refresh_compute_weights(head_group_);
  }
  const int64_t n = batch * seq, h = args_.hidden_size;
  std::memcpy(ids_.data(), input_ids, n * sizeof(int32_t));
  if (labels != nullptr) {
    std::memcpy(targets_.data(), labels, n * sizeof(int32_t));
  } else {
    std::fill(targets_.begin(), targets_.begin() + n, kIgnoreIndex);
  }
  upload_token_rows();

  // HF concatenates every sparse layer's router logits into one statistic (not a mean of
  // per-layer losses); the counts and probability sums are all it needs.
  const bool aux = args_.output_router_logits && n_sparse_layers_ > 0;
  const int64_t E = args_.num_experts, k = args_.num_experts_per_tok;
  if (aux) router_statistics_.assign(2 * E + 1, 0.0);
  double* router_counts = aux ? router_statistics_.data() : nullptr;
  double* router_prob_sums = aux ? router_counts + E : nullptr;
  const auto n_layers = static_cast<int64_t>(m_.layers.size());
  const bool grad = options.compute_grad;
  acquire(0, false);
  if (n_layers > 0) {
    prefetch(layer_group_index(0));
  } else {
    prefetch(head_group_, GroupReads::through_copies);
  }
  // Each rank's vocabulary rows give a partial sum, whole or (sequence parallel) at its tokens.
  float* embedded = call_.block_output(acts_.resid[0]);
  m_.embed_tokens.forward(embedded, kernel_tokens(TokenRow::ids), n);
  if (tp_degree_ > 1) call_.sum_block_output(acts_.resid[0], embedded, h);
  release(0, grad || head_group_ == 0 ? GroupUseEnd::used_later : GroupUseEnd::last);
  for (size_t i = 0; i < m_.layers.size(); ++i) {
    const int64_t group = layer_group_index(static_cast<int64_t>(i));
    const bool last_layer = i + 1 == m_.layers.size();
    acquire(group, false);
    if (last_layer) {
      prefetch(head_group_, GroupReads::through_copies);
    } else {
      prefetch(layer_group_index(static_cast<int64_t>(i) + 1));
    }
    LayerActivations& a = acts_.layers[i];
    layer_forward(i, a);
    release(group, !grad        ? GroupUseEnd::last
                   : last_layer ? GroupUseEnd::used_next
                                : GroupUseEnd::used_later);
    if (aux && m_.layers[i].sparse) {
      // A sparse block routes this rank's tokens: under EP x TP its sequence shard.
      device_ops().load_balancing_accumulate(router_counts, router_prob_sums, a.moe.router_probs,
                                             a.moe.topk_index,
                                             sparse_on_shards_ ? n / tp_degree_ : n, E, k);
    }
  }
  if (aux) reduce_router_statistics();
  int64_t router_rows = n_sparse_layers_ * n;
  if (aux && options.sum_router_statistics) {
    // The other ranks' tokens of this micro-batch step join the statistics (exact: the counts
    // and rows are integers far below 2^53); the probability sums are summed in MPI's order.
    router_statistics_[2 * E] = static_cast<double>(router_rows);
    options.sum_router_statistics(router_statistics_.data(), 2 * E + 1);
    router_rows = static_cast<int64_t>(router_statistics_[2 * E]);
  }
  aux_loss_ =
      aux ? device_ops().load_balancing_loss(router_counts, router_prob_sums, E, router_rows) : 0.0;
  aux_grad_ = aux && options.compute_grad;
  if (aux_grad_) {
    // Each of this rank's rows takes the summed statistics' gradient: summed over the ranks by the
    // gradients' reduction, it is the gradient of the loss over their tokens together.
    aux_dprobs_.resize(E);
    device_ops().load_balancing_grad(kernel_aux_dprobs(), router_counts, E, router_rows,
                                     args_.router_aux_loss_coef * options.aux_loss_scale);
  }
  // The [norm, lm_head] unit stays in use from here into the backward's final norm when computing
  // gradients, reading the lm_head through its copy (a tied embedding too: the lookup is done);
  // the backward's first use after it: the last block, or the embedding (nothing to prefetch).
  acquire(head_group_, grad, GroupReads::through_copies);
  if (grad && n_layers > 0) prefetch(layer_group_index(n_layers - 1));
  m_.norm.forward(acts_.final_norm, acts_.final_norm_rstd, acts_.resid.back(), call_.rows());

  // Under sequence parallel the final norm's rows are gathered whole for the loss: the lm_head is
  // cut along the vocabulary, so each rank scores every token on its rows (torchtitan's norm
  // output Shard(1) into a column-wise lm_head with loss_parallel).
  CrossEntropyArgs ce;
  ce.x = call_.gather_block_input(acts_.final_norm, h);
  ce.weight = m_.lm_head.weight;
  ce.weight_bf16 = m_.lm_head.weight_bf16;
  ce.x_bf16 = acts_.linear.x_bf16;
  ce.targets = kernel_tokens(TokenRow::targets);
  ce.n_tokens = n;
  ce.hidden = h;
  ce.vocab = tp_degree_ > 1 ? vocab_shard_.rows : args_.vocab_size;
  ce.logits = options.logits;
  // A kernel without chunk_tokens picks its own (0).
  ce.chunk_tokens = lm_head_loss_->chunk_tokens != nullptr
                        ? lm_head_loss_->chunk_tokens(n, args_.vocab_size, 0)
                        : 0;
  ce.workspace = acts_.loss_workspace;
  if (options.compute_grad) {
    ce.dx = acts_.grad.d_norm;
    ce.dweight = m_.lm_head.weight_grad;
    ce.grad_scale = options.grad_scale;
  }
  grad_ready_ = options.compute_grad;
  CrossEntropyResult result;
  if (tp_degree_ > 1) {
    result = lm_head_loss_->forward_backward_vocab_parallel(ce, vocab_shard_);
    // Each rank's d x is its vocabulary rows' part; the final norm's backward needs the sum (at
    // this rank's tokens under sequence parallel).
    if (grad) call_.sum_block_output(call_.input_grad_rows(ce.dx), ce.dx, h);
  } else {
    result = lm_head_loss_->forward_backward(ce);
  }
  if (!grad) release(head_group_, GroupUseEnd::last);
  return result;
}

void DecoderLM::backward() {
  TITAN_CHECK(grad_ready_, "backward without a preceding forward with compute_grad");
  grad_ready_ = false;
  const int64_t n = batch_ * seq_, h = args_.hidden_size;
  Activations& g = acts_;
  // Under sequence parallel each rank's final norm saw its tokens only.
  std::vector<PartialGrad> final_norm;
  if (sequence_parallel_ && m_.norm.weight_grad != nullptr) {
    final_norm.push_back({m_.norm.weight_grad, m_.norm.dim});
  }
  summing_partial_grads(final_norm, [&] {
    m_.norm.backward(g.d_resid, call_.input_grad_rows(g.grad.d_norm), g.resid.back(),
                     g.final_norm_rstd, call_.rows());
  });
  release(head_group_, GroupUseEnd::gradients);
  // Under expert tensor parallel every TP rank routes the same whole rows and the group sums the
  // sparse blocks' input gradients and router gradients: the load-balancing loss's gradient, the
  // same on every rank, joins them on the first TP rank only.
  const float* aux_dprobs =
      aux_grad_ && (!experts_cut_by_tp_ || tp_index_ == 0) ? kernel_aux_dprobs() : nullptr;
  for (size_t i = m_.layers.size(); i-- > 0;) {
    const int64_t group = layer_group_index(static_cast<int64_t>(i));
    acquire(group, true);
    // The previous block (the embedding's backward brings no parameters).
    if (i > 0) prefetch(layer_group_index(static_cast<int64_t>(i) - 1));
    LayerActivations& a = g.layers[i];
    // Recompute (the layer's set is the shared one); rewrites resid[i + 1] identically.
    if (checkpointing_.recomputes_layer(static_cast<int64_t>(i))) layer_forward(i, a);
    summing_partial_grads(partial_grads(i), [&] {
      m_.layers[i].backward(g.d_resid, g.grad, a, g.resid[i], aux_dprobs, call_);
    });
    release(group, GroupUseEnd::gradients);
  }
  acquire(0, true, GroupReads::nothing);
  m_.embed_tokens.backward(call_.gather_output_grad(g.d_resid, h), kernel_tokens(TokenRow::ids), n);
  release(0, GroupUseEnd::gradients);
}

std::vector<DecoderLM::PartialGrad> DecoderLM::partial_grads(size_t i) const {
  const DecoderLayer& layer = m_.layers[i];
  std::vector<const RMSNorm*> norms;
  if (tp_degree_ > 1 && layer.self_attn.qk_norm) {
    norms = {&layer.self_attn.q_norm, &layer.self_attn.k_norm};
  }
  if (sequence_parallel_) {
    norms.push_back(&layer.input_layernorm);
    norms.push_back(&layer.post_attention_layernorm);
  }
  std::vector<PartialGrad> grads;
  for (const RMSNorm* norm : norms) {
    if (norm->weight_grad != nullptr) grads.push_back({norm->weight_grad, norm->dim});
  }
  const Linear& router = layer.moe.gate;
  // The router's gradient is each rank's part: of its tokens under EP x TP, of its experts'
  // partial outputs under expert tensor parallel.
  if ((sparse_on_shards_ || experts_cut_by_tp_) && layer.sparse && router.weight_grad != nullptr) {
    grads.push_back({router.weight_grad, router.out_features * router.in_features});
  }
  return grads;
}

void DecoderLM::summing_partial_grads(const std::vector<PartialGrad>& grads,
                                      const std::function<void()>& backward) {
  // The parameters are replicated, but each rank's rows are its own heads or tokens: the
  // gradient is the group's sum of this backward's parts. The gradients accumulate over
  // micro-batches, so this backward's parts are taken apart from what is there, summed, and
  // added back.
  std::vector<float> earlier;
  for (const PartialGrad& p : grads) {
    earlier.insert(earlier.end(), p.grad, p.grad + p.count);
    std::fill(p.grad, p.grad + p.count, 0.0f);
  }
  backward();
  size_t at_earlier = 0;
  for (const PartialGrad& p : grads) {
    collectives_.sum_partials(p.grad, p.count);
    for (int64_t j = 0; j < p.count; ++j) p.grad[j] += earlier[at_earlier++];
  }
}

float* DecoderLM::kernel_aux_dprobs() {
  if (&backend().memory() == &host_memory()) return aux_dprobs_.data();
  if (aux_dprobs_device_.data() == nullptr) {
    aux_dprobs_device_ =
        Buffer(backend().memory(), static_cast<size_t>(args_.num_experts) * sizeof(float),
               MemCategory::other);
  }
  return aux_dprobs_device_.as<float>();
}

void DecoderLM::reduce_router_statistics() {
  if (!sparse_on_shards_ || n_sparse_layers_ == 0) return;
  // Counts and probability sums: router_statistics_[0, 2E).
  const auto E = static_cast<int64_t>(args_.num_experts);
  collectives_.sum_statistics(router_statistics_.data(), 2 * E);
}

std::unique_ptr<CausalLM> make_decoder_lm(const ModelArgs& args,
                                          const std::vector<OverrideRule>& overrides,
                                          DType compute_dtype, Residency params,
                                          const ParallelizePlan& plan) {
  return std::make_unique<DecoderLM>(args, overrides, compute_dtype, params, plan);
}

}  // namespace titan
