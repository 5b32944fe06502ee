#include "titan/models/decoder_lm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <string_view>

#include "titan/core/error.h"
#include "titan/dispatch/device_ops.h"
#include "titan/models/state_dict_adapter.h"

namespace titan {
namespace {

std::string layer_name(int64_t i) {
  return "model.layers." + std::to_string(i);
}

// `compute`: the dtype of the matmuls' operands (the experts' GEMMs included); the router,
// norms, RoPE, attention and SwiGLU stay fp32. Each slot starts on the running device's default
// kernel of its kind (dispatch/registry.h), attention on the one `attn_backend` names.
std::vector<KernelSlot> default_slots(const ModelArgs& a, DType compute) {
  const KernelRegistry& registry = kernel_registry();
  const DeviceKind device = backend().kind();
  const auto slot = [&](std::string module, OpKind kind, DType dtype = DType::f32) {
    return KernelSlot{std::move(module), kind, registry.default_kernel(kind, device), dtype,
                      device};
  };
  std::vector<KernelSlot> slots = {slot("model.embed_tokens", OpKind::embedding)};
  for (int64_t i = 0; i < a.num_hidden_layers; ++i) {
    const std::string p = layer_name(i);
    slots.push_back(slot(p + ".input_layernorm", OpKind::rms_norm));
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      slots.push_back(slot(p + ".self_attn." + proj, OpKind::linear, compute));
    }
    if (a.qk_norm) {
      slots.push_back(slot(p + ".self_attn.q_norm", OpKind::rms_norm));
      slots.push_back(slot(p + ".self_attn.k_norm", OpKind::rms_norm));
    }
    slots.push_back(slot(p + ".self_attn", OpKind::rope));
    slots.push_back(
        {p + ".self_attn", OpKind::attention, "attention_" + a.attn_backend, DType::f32, device});
    slots.push_back(slot(p + ".post_attention_layernorm", OpKind::rms_norm));
    if (a.layer_is_sparse(i)) {
      slots.push_back(slot(p + ".mlp.gate", OpKind::linear));
      slots.push_back(slot(p + ".mlp.gate", OpKind::router));
      // experts_staged (the default): the block runs the three stage slots that follow
      // (ops/moe_stages.h); a fused experts kernel bound here instead replaces all three.
      slots.push_back(slot(p + ".mlp.experts", OpKind::experts, compute));
      slots.push_back(slot(p + ".mlp.experts", OpKind::moe_dispatch, compute));
      slots.push_back(slot(p + ".mlp.experts", OpKind::grouped_experts, compute));
      slots.push_back(slot(p + ".mlp.experts", OpKind::moe_combine));
      continue;
    }
    for (const char* proj : {"gate_proj", "up_proj", "down_proj"}) {
      slots.push_back(slot(p + ".mlp." + proj, OpKind::linear, compute));
    }
    slots.push_back(slot(p + ".mlp", OpKind::swiglu));
  }
  slots.push_back(slot("model.norm", OpKind::rms_norm));
  slots.push_back(slot("lm_head", OpKind::lm_head_loss, compute));
  return slots;
}

// The activation arena sizes the lm_head loss's workspace, and a step its chunks, as the running
// device's default loss kernel takes them.
const LmHeadLossKernel& default_loss_kernel() {
  const KernelRegistry& registry = kernel_registry();
  const std::string& name = registry.default_kernel(OpKind::lm_head_loss, backend().kind());
  return std::get<LmHeadLossKernel>(registry.get(name, OpKind::lm_head_loss).impl);
}

// The constraints of every attention and experts slot's kernel on the shapes a step of
// (batch, seq) tokens hands it: a broken one is a titan::Error naming the module.
void check_slot_constraints(const std::vector<KernelSlot>& slots, const ModelArgs& a, int64_t batch,
                            int64_t seq) {
  for (const KernelSlot& slot : slots) {
    if (slot.kind == OpKind::attention) {
      const KernelEntry& entry = kernel_registry().get(slot.kernel, OpKind::attention);
      require_constraints(
          slot.module, slot.kernel, std::get<AttentionKernel>(entry.impl),
          {batch, seq, seq, a.num_attention_heads, a.num_key_value_heads, a.head_dim});
    } else if (slot.kind == OpKind::experts) {
      const KernelEntry& entry = kernel_registry().get(slot.kernel, OpKind::experts);
      require_constraints(slot.module, slot.kernel, std::get<ExpertsKernel>(entry.impl),
                          {batch * seq, a.hidden_size, a.moe_intermediate_size, a.num_experts,
                           a.num_experts_per_tok});
    }
  }
}

// Hands out consecutive 64-byte aligned views of an arena; with a null base it only measures.
class Carver {
 public:
  explicit Carver(float* base) : base_(base) {}
  float* take(int64_t n) {
    float* p = base_ == nullptr ? nullptr : base_ + used_;
    used_ += (n + 15) / 16 * 16;
    return p;
  }
  int64_t used() const { return used_; }
  // Back to `used` floats: what is taken next overlaps what was taken after it.
  void rewind(int64_t used) { used_ = used; }
  // Past `used` floats, if not already.
  void skip_past(int64_t used) { used_ = std::max(used_, used); }

 private:
  float* base_;
  int64_t used_ = 0;
};

// A linear module over `name`.weight, and `name`.bias when the group has one.
Linear make_linear(const std::string& name, const ParamGroup& g, const KernelBinder& binder,
                   int64_t in, int64_t out) {
  Linear l;
  l.name = name;
  l.in_features = in;
  l.out_features = out;
  l.weight = g.params() + g.view(name + ".weight").offset;
  if (const ParamView* bias = g.find(name + ".bias")) l.bias = g.params() + bias->offset;
  const KernelEntry& kernel = binder.bind(name, OpKind::linear);
  l.kernel = &std::get<LinearKernel>(kernel.impl);
  l.kernel_name = kernel.name;
  return l;
}

// Points a linear module at its gradient views.
void bind_linear_grads(Linear& l, const ParamGroup& g) {
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
                     DType compute_dtype, Residency params)
    : args_(args), compute_dtype_(compute_dtype) {
  validate_model_args(args_, "model");
  TITAN_CHECK(compute_dtype == DType::f32 || compute_dtype == DType::bf16, "model: compute in ",
              dtype_name(compute_dtype), " is not supported (F32 or BF16)");
  slots_ = default_slots(args_, compute_dtype_);
  override_report_ = apply_overrides(slots_, overrides, kernel_registry());
  const KernelBinder binder(slots_);
  const int64_t h = args_.hidden_size, hd = args_.head_dim;

  for (ParamGroupSpec& g : model_param_specs(args_)) {
    // bf16 units in flight (FSDP): the weights read only in bf16 last, so the fp32 masters a unit
    // in flight commits (FullyShardedGroups) lie together at the start of its buffer.
    if (compute_dtype_ == DType::bf16 && params == Residency::released) {
      std::stable_partition(g.params.begin(), g.params.end(),
                            [](const ParamSpec& p) { return !read_only_in_bf16(p.name); });
    }
    groups_.emplace_back(g.name, g.params, params);
  }

  head_group_ = head_group_index(args_);
  const ParamGroup &g0 = groups_[0], &head = groups_[static_cast<size_t>(head_group_)];
  Embedding& embed = m_.embed_tokens;
  embed.name = "model.embed_tokens";
  embed.vocab = args_.vocab_size;
  embed.dim = h;
  embed.weight = g0.params() + g0.view("model.embed_tokens.weight").offset;
  embed.kernel =
      &std::get<EmbeddingKernel>(binder.bind("model.embed_tokens", OpKind::embedding).impl);
  m_.norm = make_norm("model.norm", head, binder, h, args_.rms_norm_eps);
  // The training loss runs the lm_head inside its kernel; this module serves inference, whose
  // one-token logits are a GEMV on the device's default linear kernel.
  Linear& lm_head = m_.lm_head;
  lm_head.name = "lm_head";
  lm_head.in_features = h;
  lm_head.out_features = args_.vocab_size;
  lm_head.weight =
      args_.tie_word_embeddings ? embed.weight : head.params() + head.view("lm_head.weight").offset;
  const KernelEntry& builtin_linear = kernel_registry().get(
      kernel_registry().default_kernel(OpKind::linear, backend().kind()), OpKind::linear);
  lm_head.kernel = &std::get<LinearKernel>(builtin_linear.impl);
  lm_head.kernel_name = builtin_linear.name;
  lm_head_loss_ = &std::get<LmHeadLossKernel>(binder.bind("lm_head", OpKind::lm_head_loss).impl);

  for (int64_t i = 0; i < args_.num_hidden_layers; ++i) {
    const ParamGroup& g = groups_[static_cast<size_t>(layer_group_index(i))];
    const std::string p = layer_name(i);
    DecoderLayer layer;
    layer.name = p;
    layer.input_layernorm = make_norm(p + ".input_layernorm", g, binder, h, args_.rms_norm_eps);
    SelfAttention& at = layer.self_attn;
    at.name = p + ".self_attn";
    at.n_heads = args_.num_attention_heads;
    at.n_kv_heads = args_.num_key_value_heads;
    at.head_dim = hd;
    at.q_proj = make_linear(at.name + ".q_proj", g, binder, h, at.n_heads * hd);
    at.k_proj = make_linear(at.name + ".k_proj", g, binder, h, at.n_kv_heads * hd);
    at.v_proj = make_linear(at.name + ".v_proj", g, binder, h, at.n_kv_heads * hd);
    at.o_proj = make_linear(at.name + ".o_proj", g, binder, at.n_heads * hd, h);
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
      moe.intermediate = args_.moe_intermediate_size;
      moe.n_experts = args_.num_experts;
      moe.top_k = args_.num_experts_per_tok;
      moe.norm_topk_prob = args_.norm_topk_prob;
      moe.gate = make_linear(moe.name + ".gate", g, binder, h, moe.n_experts);
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
    } else {
      SwigluMlp& mlp = layer.mlp;
      mlp.name = p + ".mlp";
      mlp.hidden = h;
      mlp.intermediate = args_.intermediate_size;
      mlp.gate_proj = make_linear(mlp.name + ".gate_proj", g, binder, h, mlp.intermediate);
      mlp.up_proj = make_linear(mlp.name + ".up_proj", g, binder, h, mlp.intermediate);
      mlp.down_proj = make_linear(mlp.name + ".down_proj", g, binder, mlp.intermediate, h);
      mlp.swiglu = &std::get<SwigluKernel>(binder.bind(mlp.name, OpKind::swiglu).impl);
    }
    m_.layers.push_back(std::move(layer));
  }
  if (compute_dtype_ == DType::bf16) allocate_compute_weights(params);
}

void DecoderLM::allocate_compute_weights(Residency head_residency) {
  // Each weight with the module's pointer to its copy.
  struct Target {
    const float* master;
    int64_t numel;
    const uint16_t** copy;
  };
  std::vector<Target> targets;
  // The lm_head's weight is the embedding's when tied: its copy serves the head.
  for (Linear* w : m_.matmul_linears()) {
    targets.push_back({w->weight, w->out_features * w->in_features, &w->weight_bf16});
  }
  for (DecoderLayer& l : m_.layers) {
    if (!l.sparse) continue;
    SparseMoeBlock& moe = l.moe;  // the router (moe.gate) stays fp32
    const int64_t n = moe.n_experts * moe.intermediate * moe.hidden;  // each of the three
    targets.push_back({moe.weights.gate, n, &moe.weights_bf16.gate});
    targets.push_back({moe.weights.up, n, &moe.weights_bf16.up});
    targets.push_back({moe.weights.down, n, &moe.weights_bf16.down});
  }
  const auto group_of = [&](const float* master) {
    for (size_t g = 0; g < groups_.size(); ++g) {
      const float* begin = groups_[g].params();
      if (master >= begin && master < begin + groups_[g].numel()) return static_cast<int64_t>(g);
    }
    fail("model: a matmul weight outside every parameter group");
  };
  std::vector<int64_t> totals(groups_.size(), 0);
  for (const Target& t : targets) totals[static_cast<size_t>(group_of(t.master))] += t.numel;
  std::vector<uint16_t*> next(groups_.size(), nullptr);
  int64_t largest_block = 0;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const bool head = static_cast<int64_t>(g) == head_group_;
    compute_weights_.emplace_back(static_cast<size_t>(totals[g]) * sizeof(uint16_t),
                                  MemCategory::parameters,
                                  head ? head_residency : Residency::released);
    next[g] = compute_weights_.back().as<uint16_t>();
    if (!head) largest_block = std::max(largest_block, totals[g]);
  }
  block_in_flight_ = Buffer(static_cast<size_t>(largest_block) * sizeof(uint16_t),
                            MemCategory::parameters, Residency::released);
  for (const Target& t : targets) {
    const int64_t g = group_of(t.master);
    uint16_t*& copy = next[static_cast<size_t>(g)];
    *t.copy = copy;
    compute_copies_.push_back(
        {t.master, copy, copy, t.copy, t.numel, g, t.master == m_.embed_tokens.weight});
    copy += t.numel;
  }
}

void DecoderLM::bind_compute_copies(int64_t group, uint16_t* base) {
  const auto* own = compute_weights_[static_cast<size_t>(group)].as<uint16_t>();
  for (ComputeCopy& c : compute_copies_) {
    if (c.group != group) continue;
    c.bound = base + (c.copy - own);
    *c.module_copy = c.bound;
  }
}

bool DecoderLM::read_only_in_bf16(const std::string& name) {
  const auto ends_with = [&](std::string_view tail) {
    return name.size() >= tail.size() &&
           name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  return ends_with("_proj.weight") || ends_with(".experts.gate_proj") ||
         ends_with(".experts.up_proj") || ends_with(".experts.down_proj") ||
         name == "lm_head.weight";
}

void DecoderLM::refresh_compute_weights(int64_t group, bool all) {
  for (const ComputeCopy& c : compute_copies_) {
    if (group >= 0 && c.group != group) continue;
    if (!all && !c.master_read) continue;
    device_ops().round_to_bf16(c.bound, c.master, c.numel);
  }
}

std::vector<std::vector<ComputeCopyTarget>> DecoderLM::copy_targets(bool with_master_read) {
  std::vector<std::vector<ComputeCopyTarget>> targets(groups_.size());
  for (const ComputeCopy& c : compute_copies_) {
    if (c.master_read && !with_master_read) continue;
    const ParamGroup& g = groups_[static_cast<size_t>(c.group)];
    const auto at = c.master - g.params();
    for (const ParamView& v : g.views()) {
      if (v.offset != at) continue;
      // The one list of what is read only in bf16, which the plan reads too.
      TITAN_CHECK(c.master_read || read_only_in_bf16(v.spec.name), "model: ", v.spec.name,
                  " has a bf16 copy but is not listed as read only in bf16");
      targets[static_cast<size_t>(c.group)].push_back({v.spec.name, c.copy});
    }
  }
  return targets;
}

std::vector<std::vector<ComputeCopyTarget>> DecoderLM::bf16_only_params() {
  return copy_targets(false);
}

std::vector<std::vector<ComputeCopyTarget>> DecoderLM::copied_params() {
  return copy_targets(true);
}

std::vector<std::vector<ComputeCopyTarget>> DecoderLM::hold_compute_copies(bool lookup_in_bf16) {
  TITAN_CHECK(compute_dtype_ == DType::bf16,
              "model: bf16 copies held as the weights of a model computing in ",
              dtype_name(compute_dtype_));
  TITAN_CHECK(!hooks_.acquire && groups_[0].grads() == nullptr,
              "model: bf16 copies held as the weights of a model under parameter-group hooks or "
              "with gradients");
  copies_held_ = true;
  for (size_t g = 0; g < groups_.size(); ++g) {
    compute_weights_[g].recommit();
    bind_compute_copies(static_cast<int64_t>(g), compute_weights_[g].as<uint16_t>());
  }
  block_in_flight_ = Buffer();
  std::vector<std::vector<ComputeCopyTarget>> targets = copied_params();
  Embedding& embed = m_.embed_tokens;
  if (!lookup_in_bf16) return targets;
  if (args_.tie_word_embeddings) {
    embed.weight_bf16 = m_.lm_head.weight_bf16;
    return targets;
  }
  embedding_bf16_ = Buffer(static_cast<size_t>(embed.vocab * embed.dim) * sizeof(uint16_t),
                           MemCategory::parameters);
  embed.weight_bf16 = embedding_bf16_.as<uint16_t>();
  targets[0].push_back({embed.name + ".weight", embedding_bf16_.as<uint16_t>()});
  return targets;
}

void DecoderLM::acquire(int64_t group, bool gradients, GroupReads reads) {
  const auto g = static_cast<size_t>(group);
  if (!hooks_.acquire) {
    // One process: a block's bf16 copies are made at each use, as under FSDP, in the one buffer
    // every block's share. The [norm, lm_head] unit's are made at the forward's start and kept.
    // Copies held as the weights are already bound in place.
    if (compute_copies_.empty() || reads == GroupReads::nothing || copies_held_) return;
    if (group == head_group_ || compute_weights_[g].bytes() == 0) return;
    block_in_flight_.recommit();
    bind_compute_copies(group, block_in_flight_.as<uint16_t>());
    refresh_compute_weights(group);
    return;
  }
  const bool prefetched = prefetched_ == group;
  if (prefetched) prefetched_ = -1;
  if (!reads_copies(group, reads)) {
    hooks_.acquire(group, gradients, reads);
    return;
  }
  // Copies the acquire fills come from a gather (all of them for a use through_copies): a unit
  // kept whole since its last use kept those, and its masters of them were never written. A unit
  // kept since a use that read its parameters has its other copies (a tied embedding's) rounded
  // from its masters when a use through_copies first reads them. (A prefetched unit is resident
  // too, but its gather is filling them.)
  const bool kept = groups_[g].params_resident() && !prefetched;
  compute_weights_[g].recommit();  // the acquire may write them
  bind_compute_copies(group, compute_weights_[g].as<uint16_t>());
  hooks_.acquire(group, gradients, reads);
  if (!hooks_.fills_compute_copies) {
    refresh_compute_weights(group);
  } else if (kept && reads == GroupReads::through_copies) {
    refresh_compute_weights(group, false);
  }
}

bool DecoderLM::reads_copies(int64_t group, GroupReads reads) const {
  // A use through_copies reads every copy of the group; one reading its parameters only the
  // copies of the weights read only in bf16 (a tied embedding's copy serves the loss, not the
  // lookup). A use that reads none brings none: its copies are not touched.
  return std::any_of(compute_copies_.begin(), compute_copies_.end(), [&](const ComputeCopy& c) {
    return c.group == group && (reads == GroupReads::through_copies ||
                                (reads == GroupReads::parameters && !c.master_read));
  });
}

void DecoderLM::prefetch(int64_t group, GroupReads reads) {
  if (!hooks_.prefetch) return;
  const auto g = static_cast<size_t>(group);
  if (reads != GroupReads::nothing && !groups_[g].params_resident()) {
    prefetched_ = group;
    if (reads_copies(group, reads)) {
      compute_weights_[g].recommit();
      bind_compute_copies(group, compute_weights_[g].as<uint16_t>());
    }
  }
  hooks_.prefetch(group, reads);
}

void DecoderLM::release(int64_t group, GroupUseEnd end) {
  const auto g = static_cast<size_t>(group);
  if (!hooks_.release) return;  // one process: block_in_flight_ stays committed
  hooks_.release(group, end);
  if (compute_copies_.empty()) return;
  if (!hooks_.fills_compute_copies || !groups_[g].params_resident()) compute_weights_[g].decommit();
}

void DecoderLM::initialize(uint64_t seed) {
  initialize_param_groups(groups_, args_, seed);
}

void DecoderLM::allocate_gradients() {
  TITAN_CHECK(!copies_held_, "model: gradients of a model whose bf16 copies are its weights");
  for (ParamGroup& g : groups_) g.allocate_gradients();
  // Point every module at its gradient view.
  const auto grad_of = [](const ParamGroup& g, const std::string& param) {
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
}

void DecoderLM::check_kernel_constraints(int64_t batch, int64_t seq) const {
  check_slot_constraints(slots_, args_, batch, seq);
}

void DecoderLM::set_activation_checkpointing(bool full) {
  if (full == checkpoint_layers_) return;
  checkpoint_layers_ = full;
  arena_ = Buffer();
  batch_ = seq_ = 0;  // the arena is re-carved on the next forward
}

void DecoderLM::set_forward_only() {
  forward_only_ = true;
  arena_ = Buffer();
  batch_ = seq_ = 0;
}

DecoderLM::Retention DecoderLM::retention() const {
  if (forward_only_) return Retention::nothing;
  return checkpoint_layers_ ? Retention::block_inputs : Retention::every_layer;
}

int64_t DecoderLM::carve_activations(const ModelArgs& args, DType compute_dtype,
                                     Retention retention, float* base, int64_t batch, int64_t seq,
                                     Activations& v) {
  const int64_t n = batch * seq, h = args.hidden_size, hd = args.head_dim;
  const int64_t H = args.num_attention_heads, KV = args.num_key_value_heads;
  const int64_t I = args.intermediate_size, Im = args.moe_intermediate_size;
  const int64_t E = args.num_experts, k = args.num_experts_per_tok, rows = n * k;
  const int64_t n_layers = args.num_hidden_layers;
  int64_t n_sparse = 0;
  for (int64_t i = 0; i < n_layers; ++i) n_sparse += args.layer_is_sparse(i) ? 1 : 0;
  const bool any_sparse = n_sparse > 0, any_dense = n_sparse < n_layers;
  // One layer's set serves every layer unless each keeps its own for the backward.
  const bool one_set = retention != Retention::every_layer;
  Carver c(base);
  // Index arrays share the float arena (same width); bf16 values take two to a float.
  const auto take_ints = [&](int64_t count) { return reinterpret_cast<int32_t*>(c.take(count)); };
  const auto take_bf16 = [&](int64_t count) {
    return reinterpret_cast<uint16_t*>(c.take((count + 1) / 2));
  };
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
        c.take(n * E),
        c.take(n * k),
        {x_rows, c.take(rows * h), c.take(rows * Im), c.take(rows * Im), c.take(rows * Im),
         c.take(rows), c.take(rows), keep_bf16 && x_rows != nullptr ? x_rows + out_at : nullptr}};
  }
  float* norm_scratch = keep_bf16 ? c.take(n * h) : nullptr;
  // A dense MLP's product and the experts' are recomputed in the backward, never kept.
  float* mlp_act = any_dense ? c.take(n * I) : nullptr;
  float* experts_act = nullptr;
  if (any_sparse) {
    experts_act = keep_bf16 ? reinterpret_cast<float*>(take_bf16(rows * Im)) : c.take(rows * Im);
  }
  const MlpActivations mlp_scratch =
      keep_bf16 && any_dense
          ? MlpActivations{c.take(n * I), c.take(n * I), mlp_act,         nullptr,
                           nullptr,       nullptr,       take_bf16(n * I)}
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
      attn_scratch.kept.q = take_bf16(n * H * hd);
      attn_scratch.kept.k = take_bf16(n * KV * hd);
    }
    attn_scratch.v = c.take(n * KV * hd);
    attn_scratch.out = c.take(n * H * hd);
  }
  const int64_t layers_end = c.used();
  c.rewind(shared_begin);
  const int64_t loss_bytes = default_loss_kernel().workspace_bytes(
      n, args.hidden_size, args.vocab_size, 0, compute_dtype == DType::bf16);
  v.loss_workspace = c.take((loss_bytes + sizeof(float) - 1) / sizeof(float));
  c.skip_past(layers_end);
  // The residual streams: each block's input and the last block's output, or, with nothing kept
  // for a backward, two in turn.
  const int64_t streams =
      retention == Retention::nothing ? std::min<int64_t>(2, n_layers + 1) : n_layers + 1;
  std::vector<float*> stream(static_cast<size_t>(streams));
  for (float*& r : stream) r = c.take(n * h);
  v.resid.assign(n_layers + 1, nullptr);
  for (size_t i = 0; i < v.resid.size(); ++i) v.resid[i] = stream[i % stream.size()];
  v.layers.assign(one_set ? 1 : n_layers, {});
  for (size_t i = 0; i < v.layers.size(); ++i) {
    LayerActivations& a = v.layers[i];
    // The shared set of checkpointing serves every layer, so it holds both kinds of MLP.
    const auto layer = static_cast<int64_t>(i);
    const bool sparse = one_set ? any_sparse : args.layer_is_sparse(layer);
    const bool dense = one_set ? any_dense : !args.layer_is_sparse(layer);
    a.norm1 = keep_bf16 ? norm_scratch : c.take(n * h);
    a.attn.x_bf16 = keep_bf16 ? take_bf16(n * h) : nullptr;
    a.norm1_rstd = c.take(n);
    if (keep_bf16) {
      a.attn.q_pre = attn_scratch.q_pre;
      a.attn.k_pre = attn_scratch.k_pre;
      a.attn.q = attn_scratch.q;
      a.attn.k = attn_scratch.k;
      a.attn.v = attn_scratch.v;
      a.attn.out = attn_scratch.out;
      if (args.qk_norm) {
        a.attn.kept.q_pre = take_bf16(n * H * hd);
        a.attn.kept.k_pre = take_bf16(n * KV * hd);
        a.attn.kept.q = attn_scratch.kept.q;
        a.attn.kept.k = attn_scratch.kept.k;
      } else {
        a.attn.kept.q = take_bf16(n * H * hd);
        a.attn.kept.k = take_bf16(n * KV * hd);
      }
      a.attn.kept.v = take_bf16(n * KV * hd);
      a.attn.kept.out = take_bf16(n * H * hd);
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
    a.resid_mid = c.take(n * h);
    // The router reads the MoE block's input in fp32, forward and backward.
    a.norm2 = keep_bf16 && !sparse ? norm_scratch : c.take(n * h);
    a.norm2_rstd = c.take(n);
    if (dense && keep_bf16) {
      a.mlp = mlp_scratch;
      a.mlp.x_bf16 = take_bf16(n * h);
      a.mlp.gate_bf16 = take_bf16(n * I);
      a.mlp.up_bf16 = take_bf16(n * I);
    } else if (dense) {
      a.mlp = {c.take(n * I), c.take(n * I), mlp_act};
    }
    if (sparse) {
      a.moe.router_logits = c.take(n * E);
      a.moe.router_probs = c.take(n * E);
      a.moe.topk_index = take_ints(n * k);
      a.moe.topk_weight = c.take(n * k);
      // A bf16 experts kernel keeps gate and up as bf16 values (ops/moe.h).
      const auto take_kept = [&] {
        return keep_bf16 ? reinterpret_cast<float*>(take_bf16(rows * Im)) : c.take(rows * Im);
      };
      float* gate = take_kept();
      float* up = take_kept();
      a.moe.experts = {gate, up, experts_act, take_ints(rows), take_ints(E + 1)};
    }
  }
  v.final_norm = c.take(n * h);
  v.final_norm_rstd = c.take(n);
  if (keep_bf16) {
    // The inputs rounded here are o_proj's and the lm_head's (the others are kept above); the
    // output gradients are every linear's.
    v.linear.x_bf16 = take_bf16(n * std::max(h, H * hd));
    v.linear.dy_bf16 = take_bf16(n * std::max({h, H * hd, any_dense ? I : 0}));
  }
  if (retention != Retention::nothing) {
    v.d_resid = c.take(n * h);
    g.d_norm = c.take(n * h);
  }
  return c.used();
}

int64_t DecoderLM::activation_bytes_of(const ModelArgs& args, DType compute_dtype,
                                       bool checkpointing, int64_t batch, int64_t seq) {
  return arena_floats(args, compute_dtype,
                      checkpointing ? Retention::block_inputs : Retention::every_layer, batch,
                      seq) *
         static_cast<int64_t>(sizeof(float));
}

int64_t DecoderLM::arena_floats(const ModelArgs& args, DType compute_dtype, Retention retention,
                                int64_t batch, int64_t seq) {
  Activations measured;
  return carve_activations(args, compute_dtype, retention, nullptr, batch, seq, measured);
}

int64_t DecoderLM::activation_bytes(int64_t batch, int64_t seq) const {
  return arena_floats(args_, compute_dtype_, retention(), batch, seq) *
         static_cast<int64_t>(sizeof(float));
}

void DecoderLM::ensure_activations(int64_t batch, int64_t seq) {
  // Under bf16 the loss's workspace holds rows per OpenMP thread.
  const int threads = omp_get_max_threads();
  if (batch == batch_ && seq == seq_ && threads == arena_threads_) return;
  const int64_t n = batch * seq;
  arena_ = Buffer();  // release the old arena before taking the new one
  arena_ = Buffer(static_cast<size_t>(activation_bytes(batch, seq)), MemCategory::activations);
  carve_activations(args_, compute_dtype_, retention(), arena_.as<float>(), batch, seq, acts_);
  batch_ = batch;
  seq_ = seq;
  arena_threads_ = threads;
  ids_.resize(n);
  targets_.resize(n);
  positions_.resize(n);
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
}

void DecoderLM::layer_forward(size_t i, LayerActivations& a) {
  m_.layers[i].forward(acts_.resid[i + 1], a, acts_.resid[i], call_);
}

CrossEntropyResult DecoderLM::forward(const int32_t* input_ids, const int32_t* labels,
                                      int64_t batch, int64_t seq, const ForwardOptions& options) {
  TITAN_CHECK(batch > 0 && seq > 0, "forward: batch (", batch, ") and seq (", seq,
              ") must be positive");
  TITAN_CHECK(seq <= args_.max_position_embeddings, "forward: sequence length ", seq,
              " exceeds max_position_embeddings ", args_.max_position_embeddings);
  TITAN_CHECK(!options.compute_grad || groups_[0].grads() != nullptr,
              "forward with compute_grad before allocate_gradients");
  TITAN_CHECK(!options.compute_grad || !forward_only_,
              "forward with compute_grad on a model made forward-only");
  ensure_activations(batch, seq);
  // Under hooks each group's copies are made at its acquire; in one process the blocks' are too,
  // and the head's here.
  if (!hooks_.acquire && !compute_copies_.empty() && !copies_held_) {
    compute_weights_[static_cast<size_t>(head_group_)].recommit();
    refresh_compute_weights(head_group_);
  }
  const int64_t n = batch * seq, h = args_.hidden_size;
  std::memcpy(ids_.data(), input_ids, n * sizeof(int32_t));
  if (labels != nullptr) {
    std::memcpy(targets_.data(), labels, n * sizeof(int32_t));
  } else {
    std::fill(targets_.begin(), targets_.begin() + n, kIgnoreIndex);
  }

  // HF concatenates every sparse layer's router logits into one statistic (not a mean of
  // per-layer losses); the counts and probability sums are all it needs.
  const bool aux = args_.output_router_logits && n_sparse_layers_ > 0;
  const int64_t E = args_.num_experts, k = args_.num_experts_per_tok;
  if (aux) {
    router_counts_.assign(E, 0.0);
    router_prob_sums_.assign(E, 0.0);
  }
  const auto n_layers = static_cast<int64_t>(m_.layers.size());
  const bool grad = options.compute_grad;
  acquire(0, false);
  if (n_layers > 0) {
    prefetch(layer_group_index(0));
  } else {
    prefetch(head_group_, GroupReads::through_copies);
  }
  m_.embed_tokens.forward(acts_.resid[0], ids_.data(), n);
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
    LayerActivations& a = acts_.layers[retention() == Retention::every_layer ? i : 0];
    layer_forward(i, a);
    release(group, !grad        ? GroupUseEnd::last
                   : last_layer ? GroupUseEnd::used_next
                                : GroupUseEnd::used_later);
    if (aux && m_.layers[i].sparse) {
      device_ops().load_balancing_accumulate(router_counts_.data(), router_prob_sums_.data(),
                                             a.moe.router_probs, a.moe.topk_index, n, E, k);
    }
  }
  const int64_t router_rows = n_sparse_layers_ * n;
  aux_loss_ = aux ? device_ops().load_balancing_loss(router_counts_.data(),
                                                     router_prob_sums_.data(), E, router_rows)
                  : 0.0;
  aux_grad_ = aux && options.compute_grad;
  if (aux_grad_) {
    aux_dprobs_.resize(E);
    device_ops().load_balancing_grad(aux_dprobs_.data(), router_counts_.data(), E, router_rows,
                                     args_.router_aux_loss_coef * options.aux_loss_scale);
  }
  // The [norm, lm_head] unit stays in use from here into the backward's final norm when computing
  // gradients, reading the lm_head through its copy (a tied embedding too: the lookup is done);
  // the backward's first use after it: the last block, or the embedding (nothing to prefetch).
  acquire(head_group_, grad, GroupReads::through_copies);
  if (grad && n_layers > 0) prefetch(layer_group_index(n_layers - 1));
  m_.norm.forward(acts_.final_norm, acts_.final_norm_rstd, acts_.resid.back(), n);

  CrossEntropyArgs ce;
  ce.x = acts_.final_norm;
  ce.weight = m_.lm_head.weight;
  ce.weight_bf16 = m_.lm_head.weight_bf16;
  ce.x_bf16 = acts_.linear.x_bf16;
  ce.targets = targets_.data();
  ce.n_tokens = n;
  ce.hidden = h;
  ce.vocab = args_.vocab_size;
  ce.logits = options.logits;
  ce.chunk_tokens = default_loss_kernel().chunk_tokens(n, args_.vocab_size, 0);
  ce.workspace = acts_.loss_workspace;
  if (options.compute_grad) {
    ce.dx = acts_.grad.d_norm;
    ce.dweight = m_.lm_head.weight_grad;
    ce.grad_scale = options.grad_scale;
  }
  grad_ready_ = options.compute_grad;
  const CrossEntropyResult result = lm_head_loss_->forward_backward(ce);
  if (!grad) release(head_group_, GroupUseEnd::last);
  return result;
}

void DecoderLM::backward() {
  TITAN_CHECK(grad_ready_, "backward without a preceding forward with compute_grad");
  grad_ready_ = false;
  const int64_t n = batch_ * seq_;
  Activations& g = acts_;
  m_.norm.backward(g.d_resid, g.grad.d_norm, g.resid.back(), g.final_norm_rstd, n);
  release(head_group_, GroupUseEnd::gradients);
  for (size_t i = m_.layers.size(); i-- > 0;) {
    const int64_t group = layer_group_index(static_cast<int64_t>(i));
    acquire(group, true);
    // The previous block (the embedding's backward brings no parameters).
    if (i > 0) prefetch(layer_group_index(static_cast<int64_t>(i) - 1));
    LayerActivations& a = g.layers[checkpoint_layers_ ? 0 : i];
    if (checkpoint_layers_) layer_forward(i, a);  // recompute; rewrites resid[i + 1] identically
    m_.layers[i].backward(g.d_resid, g.grad, a, g.resid[i],
                          aux_grad_ ? aux_dprobs_.data() : nullptr, call_);
    release(group, GroupUseEnd::gradients);
  }
  acquire(0, true, GroupReads::nothing);
  m_.embed_tokens.backward(g.d_resid, ids_.data(), n);
  release(0, GroupUseEnd::gradients);
}

OverrideReport decoder_lm_overrides(const ModelArgs& args,
                                    const std::vector<OverrideRule>& overrides, DType compute_dtype,
                                    int64_t batch, int64_t seq) {
  std::vector<KernelSlot> slots = default_slots(args, compute_dtype);
  OverrideReport report = apply_overrides(slots, overrides, kernel_registry());
  check_slot_constraints(slots, args, batch, seq);
  return report;
}

std::unique_ptr<CausalLM> make_decoder_lm(const ModelArgs& args,
                                          const std::vector<OverrideRule>& overrides,
                                          DType compute_dtype, Residency params) {
  return std::make_unique<DecoderLM>(args, overrides, compute_dtype, params);
}

}  // namespace titan
