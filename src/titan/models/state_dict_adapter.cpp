#include "titan/models/state_dict_adapter.h"

#include <algorithm>
#include <array>

#include "titan/core/error.h"

namespace titan {
namespace {

constexpr std::array<const char*, 3> kExpertProjections = {"gate_proj", "up_proj", "down_proj"};
constexpr const char* kExpertsInfix = ".mlp.experts.";

std::string layer_name(int64_t i) {
  return "model.layers." + std::to_string(i);
}

// nn.Linear `name` of (out, in): its weight, and its bias (HF init: zeros) when it has one.
void append_linear_specs(const std::string& name, int64_t out, int64_t in, bool bias,
                         std::vector<ParamSpec>& specs) {
  specs.push_back({name + ".weight", {out, in}});
  if (bias) specs.push_back({name + ".bias", {out}, ParamInit::zeros});
}

// The MLP of layer `p`: HF's dense SwiGLU, or the router and the stacked experts.
void append_mlp_specs(const ModelArgs& a, int64_t layer, const std::string& p,
                      std::vector<ParamSpec>& specs) {
  const int64_t h = a.hidden_size;
  if (!a.layer_is_sparse(layer)) {
    const int64_t I = a.intermediate_size;
    append_linear_specs(p + ".mlp.gate_proj", I, h, a.mlp_bias, specs);
    append_linear_specs(p + ".mlp.up_proj", I, h, a.mlp_bias, specs);
    append_linear_specs(p + ".mlp.down_proj", h, I, a.mlp_bias, specs);
    return;
  }
  const int64_t E = a.num_experts, Im = a.moe_intermediate_size;
  specs.push_back({p + ".mlp.gate.weight", {E, h}});
  specs.push_back({p + kExpertsInfix + "gate_proj", {E, Im, h}});
  specs.push_back({p + kExpertsInfix + "up_proj", {E, Im, h}});
  specs.push_back({p + kExpertsInfix + "down_proj", {E, h, Im}});
}

// One decoder layer's parameters, in the order of HF's modules.
std::vector<ParamSpec> layer_specs(const ModelArgs& a, int64_t layer) {
  const std::string p = layer_name(layer), attn = p + ".self_attn";
  const int64_t h = a.hidden_size, hd = a.head_dim;
  const int64_t q_out = a.num_attention_heads * hd, kv_out = a.num_key_value_heads * hd;
  std::vector<ParamSpec> specs = {{p + ".input_layernorm.weight", {h}, ParamInit::ones}};
  append_linear_specs(attn + ".q_proj", q_out, h, a.attention_bias, specs);
  append_linear_specs(attn + ".k_proj", kv_out, h, a.attention_bias, specs);
  append_linear_specs(attn + ".v_proj", kv_out, h, a.attention_bias, specs);
  append_linear_specs(attn + ".o_proj", h, q_out, a.o_proj_bias, specs);
  if (a.qk_norm) {
    specs.push_back({attn + ".q_norm.weight", {hd}, ParamInit::ones});
    specs.push_back({attn + ".k_norm.weight", {hd}, ParamInit::ones});
  }
  specs.push_back({p + ".post_attention_layernorm.weight", {h}, ParamInit::ones});
  append_mlp_specs(a, layer, p, specs);
  return specs;
}

// "model.layers.{i}.mlp.experts.gate_proj" -> {"model.layers.{i}.mlp.experts.", "gate_proj"};
// empty strings for any other name.
std::pair<std::string, std::string> split_stacked_expert(const std::string& name) {
  const size_t at = name.rfind(kExpertsInfix);
  if (at == std::string::npos) return {};
  const size_t tail = at + std::string_view(kExpertsInfix).size();
  const std::string projection = name.substr(tail);
  for (const char* known : kExpertProjections) {
    if (projection == known) return {name.substr(0, tail), projection};
  }
  return {};
}

}  // namespace

std::vector<ParamGroupSpec> model_param_specs(const ModelArgs& args) {
  validate_model_args(args, "model");
  const int64_t h = args.hidden_size;
  const ParamSpec embedding = {"model.embed_tokens.weight", {args.vocab_size, h}};
  const ParamSpec norm = {"model.norm.weight", {h}, ParamInit::ones};
  std::vector<ParamGroupSpec> groups;
  if (args.tie_word_embeddings) {
    groups.push_back({"model.embed_tokens+norm+lm_head", {embedding, norm}});
  } else {
    groups.push_back({"model.embed_tokens", {embedding}});
  }
  for (int64_t i = 0; i < args.num_hidden_layers; ++i) {
    groups.push_back({layer_name(i), layer_specs(args, i)});
  }
  if (!args.tie_word_embeddings) {
    groups.push_back({"model.norm+lm_head", {norm, {"lm_head.weight", {args.vocab_size, h}}}});
  }
  return groups;
}

const ParamSpec& ParamGroupSpec::param(const std::string& param) const {
  const auto it = std::find_if(params.begin(), params.end(),
                               [&](const ParamSpec& p) { return p.name == param; });
  TITAN_CHECK(it != params.end(), "parameter group ", name, " has no parameter ", param);
  return *it;
}

int64_t layer_group_index(int64_t layer) {
  return 1 + layer;
}

int64_t head_group_index(const ModelArgs& args) {
  return args.tie_word_embeddings ? 0 : args.num_hidden_layers + 1;
}

std::vector<ParamGroup> make_param_groups(const ModelArgs& args) {
  std::vector<ParamGroup> groups;
  for (const ParamGroupSpec& spec : model_param_specs(args))
    groups.emplace_back(spec.name, spec.params);
  return groups;
}

void initialize_param_groups(std::vector<ParamGroup>& groups, const ModelArgs& args,
                             uint64_t seed) {
  for (ParamGroup& g : groups) initialize_param_group(g, args, seed);
}

void initialize_param_group(ParamGroup& group, const ModelArgs& args, uint64_t seed) {
  group.initialize(seed, static_cast<float>(args.initializer_range));
}

std::vector<HfKey> hf_keys_for(const ParamSpec& param) {
  const auto [prefix, projection] = split_stacked_expert(param.name);
  if (prefix.empty()) return {{param.name, param.shape, param.name, 0}};
  TITAN_CHECK(param.shape.size() == 3, "stacked expert parameter ", param.name,
              " must have shape (E, out, in), got ", shape_str(param.shape));
  const Shape expert_shape = {param.shape[1], param.shape[2]};
  const int64_t expert_numel = shape_numel(expert_shape);
  std::vector<HfKey> keys;
  keys.reserve(static_cast<size_t>(param.shape[0]));
  for (int64_t e = 0; e < param.shape[0]; ++e) {
    keys.push_back({prefix + std::to_string(e) + "." + projection + ".weight", expert_shape,
                    param.name, e * expert_numel});
  }
  return keys;
}

std::vector<HfKey> hf_keys(const ModelArgs& args) {
  std::vector<HfKey> keys;
  for (const ParamGroupSpec& group : model_param_specs(args)) {
    for (const ParamSpec& param : group.params) {
      for (HfKey& key : hf_keys_for(param)) keys.push_back(std::move(key));
    }
  }
  return keys;
}

std::vector<SafetensorsTensor> hf_state_dict(const ModelArgs& args,
                                             const std::vector<ParamGroup>& groups) {
  const std::vector<ParamGroupSpec> specs = model_param_specs(args);
  TITAN_CHECK(specs.size() == groups.size(), "model: ", groups.size(),
              " parameter groups for a model of ", specs.size());
  std::vector<SafetensorsTensor> tensors;
  for (size_t g = 0; g < specs.size(); ++g) {
    for (const ParamSpec& spec : specs[g].params) {
      const ParamView& v = groups[g].view(spec.name);
      for (const HfKey& key : hf_keys_for(v.spec)) {
        tensors.push_back({key.key, Tensor::view(groups[g].params() + v.offset + key.offset,
                                                 key.shape, DType::f32)});
      }
    }
  }
  return tensors;
}

}  // namespace titan
