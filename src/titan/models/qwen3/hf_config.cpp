// Qwen3: per-head RMSNorm of q and k, attention_bias on all four projections; Qwen3-MoE adds the
// experts (Transformers 4.x's num_experts or 5.x's num_local_experts).
#include "titan/models/qwen3/hf_config.h"

#include "titan/core/error.h"

namespace titan {
namespace {

using hf::json;

ModelArgs read_attention(const hf::Fields& f, const hf::ClassDefaults& defaults) {
  ModelArgs a = hf::read_common(f, defaults);
  a.qk_norm = true;
  a.attention_bias = a.o_proj_bias = f.boolean("attention_bias", false);
  a.mlp_bias = false;
  hf::refuse_sliding_window(f, a);
  return a;
}

void read_experts(const hf::Fields& f, ModelArgs& a) {
  const json* experts = f.get("num_experts");
  const json* local = f.get("num_local_experts");
  TITAN_CHECK(experts == nullptr || local == nullptr || *experts == *local, f.where(),
              ": num_experts and num_local_experts disagree");
  a.num_experts = experts != nullptr ? f.size("num_experts") : f.size("num_local_experts");
  a.num_experts_per_tok = f.size("num_experts_per_tok");
  a.moe_intermediate_size = f.size("moe_intermediate_size");
  a.norm_topk_prob = f.boolean("norm_topk_prob", false);  // HF's class default
  a.router_aux_loss_coef = f.number("router_aux_loss_coef", 0.001);
  a.output_router_logits = f.boolean("output_router_logits", false);
  a.decoder_sparse_step = f.size("decoder_sparse_step", 1);
  a.mlp_only_layers.clear();
  if (const json* dense_layers = f.get("mlp_only_layers")) {
    TITAN_CHECK(dense_layers->is_array(), f.where(), ": mlp_only_layers must be a list");
    for (const json& layer : *dense_layers) {
      a.mlp_only_layers.push_back(f.integer(layer, "mlp_only_layers"));
    }
  }
}

json write_attention(const ModelArgs& a, const char* model_type, DType weights_dtype,
                     bool layer_types) {
  json c = hf::common_config_json(a, model_type, weights_dtype);
  c["attention_bias"] = a.attention_bias;
  hf::write_no_sliding_window(a, c, layer_types);
  return c;
}

}  // namespace

ModelArgs read_qwen3_config(const hf::Fields& f) {
  hf::ClassDefaults defaults;
  defaults.head_dim = 128;  // Qwen3Config's; Qwen3MoeConfig has none (hidden / heads)
  ModelArgs a = read_attention(f, defaults);
  a.intermediate_size = f.size("intermediate_size");
  return a;
}

ModelArgs read_qwen3_moe_config(const hf::Fields& f) {
  ModelArgs a = read_attention(f, {});
  read_experts(f, a);
  // The dense width matters only for layers kept dense; HF's class default otherwise.
  bool any_dense = false;
  for (int64_t layer = 0; layer < a.num_hidden_layers; ++layer) {
    any_dense = any_dense || !a.layer_is_sparse(layer);
  }
  a.intermediate_size = any_dense ? f.size("intermediate_size") : f.size("intermediate_size", 6144);
  return a;
}

json write_qwen3_config(const ModelArgs& a, DType weights_dtype) {
  return write_attention(a, "qwen3", weights_dtype, true);
}

json write_qwen3_moe_config(const ModelArgs& a, DType weights_dtype) {
  // Qwen3MoeConfig has no layer_types: given one, Transformers 5.23's generate builds a mask per
  // layer type that Qwen3MoeModel cannot take (static-cache generation fails).
  json c = write_attention(a, "qwen3_moe", weights_dtype, false);
  c["num_experts"] = a.num_experts;
  c["num_experts_per_tok"] = a.num_experts_per_tok;
  c["moe_intermediate_size"] = a.moe_intermediate_size;
  c["norm_topk_prob"] = a.norm_topk_prob;
  c["router_aux_loss_coef"] = a.router_aux_loss_coef;
  c["output_router_logits"] = a.output_router_logits;
  c["decoder_sparse_step"] = a.decoder_sparse_step;
  c["mlp_only_layers"] = a.mlp_only_layers;
  return c;
}

void validate_qwen3_args(const ModelArgs& a, const std::string& where) {
  TITAN_CHECK(a.qk_norm, where, ": ", a.architecture, " always has q/k norm (qk_norm = true)");
  TITAN_CHECK(a.o_proj_bias == a.attention_bias, where, ": ", a.architecture,
              " has biases on q, k, v and o_proj together (attention_bias = o_proj_bias)");
  TITAN_CHECK(!a.mlp_bias, where, ": ", a.architecture, " has no MLP biases (mlp_bias = false)");
}

}  // namespace titan
