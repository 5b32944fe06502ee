#include "titan/models/lora.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/models/parallelize.h"
#include "titan/nn/shard_runs.h"

namespace titan {
namespace {

// Where each PEFT target lives in a decoder layer, and its (in, out).
struct LoraSite {
  const char* module;  // the path under model.layers.{i}
  int64_t in, out;
};

LoraSite lora_site(const ModelArgs& a, const std::string& target) {
  const int64_t h = a.hidden_size, q = a.num_attention_heads * a.head_dim,
                kv = a.num_key_value_heads * a.head_dim, im = a.intermediate_size;
  if (target == "q_proj") return {"self_attn.q_proj", h, q};
  if (target == "k_proj") return {"self_attn.k_proj", h, kv};
  if (target == "v_proj") return {"self_attn.v_proj", h, kv};
  if (target == "o_proj") return {"self_attn.o_proj", q, h};
  if (target == "gate_proj") return {"mlp.gate_proj", h, im};
  if (target == "up_proj") return {"mlp.up_proj", h, im};
  TITAN_CHECK(target == "down_proj", "no LoRA target module named '", target, "'");
  return {"mlp.down_proj", im, h};
}

}  // namespace

std::vector<ExpertLoraSite> expert_lora_sites(const ModelArgs& a, const LoraOptions& options,
                                              const std::string& layer) {
  const std::string experts = layer + ".mlp.experts";
  const int64_t h = a.hidden_size, im = a.moe_intermediate_size;
  const bool down = options.targets("down_proj");
  std::vector<ExpertLoraSite> sites;
  // PEFT wraps the parameters in sorted order (down_proj, then gate_up_proj around it), so with
  // both adapted gate_up_proj's pair is the inner wrapper's, under base_layer.
  if (options.targets("gate_proj") && options.targets("up_proj")) {
    sites.push_back({experts + (down ? ".base_layer" : ""), ExpertLoraSite::gate_up,
                     2 * options.rank, h, 2 * im});
  }
  if (down) sites.push_back({experts, ExpertLoraSite::down, options.rank, im, h});
  return sites;
}

const std::vector<std::string>& lora_module_names() {
  static const std::vector<std::string> names = {"q_proj",    "k_proj",  "v_proj",   "o_proj",
                                                 "gate_proj", "up_proj", "down_proj"};
  return names;
}

std::vector<std::string> parse_lora_targets(const std::string& list, const std::string& where) {
  std::vector<std::string> targets;
  size_t begin = 0;
  while (begin <= list.size()) {
    const size_t end = std::min(list.find(',', begin), list.size());
    std::string name = list.substr(begin, end - begin);
    name.erase(0, name.find_first_not_of(' '));
    name.erase(name.find_last_not_of(' ') + 1);
    const auto& known = lora_module_names();
    TITAN_CHECK(std::find(known.begin(), known.end(), name) != known.end(), where, ": '", name,
                "' is not a LoRA target module (one of q_proj, k_proj, v_proj, o_proj, "
                "gate_proj, up_proj, down_proj, comma-separated)");
    TITAN_CHECK(std::find(targets.begin(), targets.end(), name) == targets.end(), where, ": '",
                name, "' is named twice");
    targets.push_back(name);
    begin = end + 1;
  }
  return targets;
}

bool LoraOptions::targets(const std::string& module) const {
  return std::find(target_modules.begin(), target_modules.end(), module) != target_modules.end();
}

std::vector<ParamGroupSpec> lora_param_specs(const ModelArgs& args, const LoraOptions& options) {
  TITAN_CHECK(options.rank >= 1, "lora.rank ", options.rank, " must be at least 1");
  const bool gate_up = options.targets("gate_proj") && options.targets("up_proj");
  TITAN_CHECK(
      !args.is_moe() || gate_up || (!options.targets("gate_proj") && !options.targets("up_proj")),
      "lora.target_modules: ", options.targets("gate_proj") ? "gate_proj" : "up_proj", " without ",
      options.targets("gate_proj") ? "up_proj" : "gate_proj",
      " on a MoE model (PEFT adapts the experts' fused gate_up_proj: name both or "
      "neither)");
  TITAN_CHECK(options.dropout == 0.0 || !args.is_moe() ||
                  (!options.targets("gate_proj") && !options.targets("down_proj")),
              "lora.dropout ", options.dropout,
              " with a MoE model's experts adapted (gate_proj, up_proj, down_proj): PEFT's "
              "ParamWrapper refuses lora_dropout != 0 (the update is merged into the experts' "
              "weight, leaving no input to drop out): set lora.dropout = 0, or adapt the "
              "attention only");
  std::vector<ParamGroupSpec> specs;
  for (int64_t i = 0; i < args.num_hidden_layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i);
    ParamGroupSpec g{layer + ".lora", {}};
    // Layer order, whatever order target_modules lists them in.
    for (const std::string& target : lora_module_names()) {
      if (!options.targets(target)) continue;
      // On a MoE model PEFT turns the MLP targets into the experts' stacked parameters
      // (below), which leaves a dense layer's MLP (mlp_only_layers) unadapted.
      const bool mlp = target == "gate_proj" || target == "up_proj" || target == "down_proj";
      if (mlp && args.is_moe()) continue;
      const LoraSite site = lora_site(args, target);
      const std::string module = layer + "." + site.module;
      g.params.push_back(
          {module + ".lora_A.weight", {options.rank, site.in}, ParamInit::kaiming_uniform});
      g.params.push_back({module + ".lora_B.weight", {site.out, options.rank}, ParamInit::zeros});
    }
    if (args.is_moe() && args.layer_is_sparse(i)) {
      for (const ExpertLoraSite& site : expert_lora_sites(args, options, layer)) {
        g.params.push_back({site.prefix + ".lora_A.weight",
                            {args.num_experts * site.rank, site.in},
                            ParamInit::kaiming_uniform});
        g.params.push_back({site.prefix + ".lora_B.weight",
                            {site.out, site.rank * args.num_experts},
                            ParamInit::zeros});
      }
    }
    specs.push_back(std::move(g));
  }
  return specs;
}

LoraAdapter::LoraAdapter(const ModelArgs& args, const LoraOptions& options,
                         const ParallelizePlan& plan)
    : options_(options),
      plan_(plan),
      moe_(args.is_moe()),
      specs_(lora_param_specs(args, options)),
      scratch_(std::make_unique<LoraScratch>()),
      expert_scratch_(std::make_unique<ExpertLoraScratch>()) {
  TITAN_CHECK(!options.target_modules.empty(), "lora.target_modules names no module");
  for (const ParamGroupSpec& g : specs_) {
    std::vector<ParamSpec> local;
    for (const ParamSpec& p : g.params) local.push_back(plan.local_spec(p));
    groups_.emplace_back(g.name, local);
  }
  for (const ParamGroup& g : groups_) {
    for (size_t p = 0; p < g.views().size(); p += 2) {
      const ParamSpec& a = g.views()[p].spec;
      if (a.name.find(".mlp.experts") != std::string::npos) continue;  // experts_ below
      LoraLinear l;
      l.name = a.name.substr(0, a.name.size() - std::string(".lora_A.weight").size());
      l.rank = options.rank;
      l.in_features = a.shape[1];
      l.out_features = g.views()[p + 1].spec.shape[0];
      // A row-wise linear's input columns are this rank's: its dropout mask is keyed by the
      // whole input's feature index.
      const Shard a_cut = plan.placement_of(a);
      l.first_in_feature = a_cut.count > 1 ? a_cut.index * l.in_features : 0;
      l.scaling = static_cast<float>(options.scaling());
      l.scratch = scratch_.get();
      linears_.push_back(std::move(l));
    }
  }
  for (int64_t i = 0; args.is_moe() && i < args.num_hidden_layers; ++i) {
    const std::string layer = "model.layers." + std::to_string(i);
    std::vector<ExpertLoraSite> sites = expert_lora_sites(args, options, layer);
    if (!args.layer_is_sparse(i) || sites.empty()) continue;
    ExpertLora e;
    e.name = layer + ".mlp.experts";
    e.n_experts = args.num_experts;
    e.hidden = args.hidden_size;
    e.inter = args.moe_intermediate_size;
    e.scaling = static_cast<float>(options.scaling());
    e.scratch = expert_scratch_.get();
    for (const ExpertLoraSite& site : sites) {
      (site.param == ExpertLoraSite::gate_up ? e.gate_up : e.down).rank = site.rank;
    }
    experts_.push_back(std::move(e));
    expert_sites_.push_back({static_cast<size_t>(i), std::move(sites)});
  }
  bind();
}

void LoraAdapter::bind() {
  size_t next = 0;
  for (const ParamGroup& g : groups_) {
    for (size_t p = 0; p < g.views().size(); p += 2) {
      const ParamView &a = g.views()[p], &b = g.views()[p + 1];
      if (a.spec.name.find(".mlp.experts") != std::string::npos) continue;
      LoraLinear& l = linears_[next++];
      l.a = g.params() + a.offset;
      l.b = g.params() + b.offset;
      l.a_grad = g.grads() != nullptr ? g.grads() + a.offset : nullptr;
      l.b_grad = g.grads() != nullptr ? g.grads() + b.offset : nullptr;
    }
  }
  for (size_t k = 0; k < experts_.size(); ++k) {
    const auto& [group, sites] = expert_sites_[k];
    const ParamGroup& g = groups_[group];
    for (const ExpertLoraSite& site : sites) {
      ExpertLoraPair& pair =
          site.param == ExpertLoraSite::gate_up ? experts_[k].gate_up : experts_[k].down;
      const ParamView& a = g.view(site.prefix + ".lora_A.weight");
      const ParamView& b = g.view(site.prefix + ".lora_B.weight");
      pair.a = g.params() + a.offset;
      pair.b = g.params() + b.offset;
      pair.a_grad = g.grads() != nullptr ? g.grads() + a.offset : nullptr;
      pair.b_grad = g.grads() != nullptr ? g.grads() + b.offset : nullptr;
    }
  }
}

const LoraLinear* LoraAdapter::find(const std::string& module) const {
  for (const LoraLinear& l : linears_) {
    if (l.name == module) return &l;
  }
  return nullptr;
}

const ExpertLora* LoraAdapter::find_experts(const std::string& experts) const {
  for (const ExpertLora& e : experts_) {
    if (e.name == experts) return &e;
  }
  return nullptr;
}

void LoraAdapter::initialize(uint64_t seed) {
  for (ParamGroup& g : groups_) {
    g.initialize(seed, 0.0f);
    for (const ParamView& v : g.views()) {
      const Shard cut = plan_.placement_of(v.spec);
      if (cut.count == 1) continue;
      // Drawn whole, as one process draws it, and this rank's cut kept.
      const ParamSpec whole = whole_param_spec(v.spec, plan_);
      std::vector<float> values(static_cast<size_t>(shape_numel(whole.shape)));
      initialize_param(whole, values.data(), seed, 0.0f);
      copy_part_out(shard_box(whole.shape, {cut}), values.data(), g.params() + v.offset);
    }
  }
}

void LoraAdapter::allocate_gradients() {
  for (ParamGroup& g : groups_) g.allocate_gradients();
  bind();
}

void LoraAdapter::begin_dropout(uint64_t seed, int64_t step, int64_t first_row, int64_t seq_len) {
  if (options_.dropout == 0.0) return;
  scratch_->dropout = {options_.dropout, true, seed, step, first_row, seq_len};
}

void LoraAdapter::end_dropout() {
  scratch_->dropout.on = false;
}

void LoraAdapter::zero_gradients() {
  for (ParamGroup& g : groups_) g.zero_gradients();
}

}  // namespace titan
