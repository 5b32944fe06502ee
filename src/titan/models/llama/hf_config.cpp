// Llama: no q/k norm, attention_bias on all four attention projections, mlp_bias on the three
// MLP ones. LlamaConfig's defaults differ from Qwen's: bos 1, eos 2, 2048 positions, kv heads =
// query heads, and it refuses a hidden size that the heads do not divide even when head_dim is
// given.
#include "titan/models/llama/hf_config.h"

#include "titan/core/error.h"

namespace titan {

ModelArgs read_llama_config(const hf::Fields& f) {
  hf::ClassDefaults defaults;
  defaults.kv_heads_default_to_heads = true;
  defaults.max_position_embeddings = 2048;
  defaults.bos_token_id = 1;
  defaults.eos_token_ids = {2};
  ModelArgs a = hf::read_common(f, defaults);
  a.intermediate_size = f.size("intermediate_size");
  a.qk_norm = false;
  a.attention_bias = a.o_proj_bias = f.boolean("attention_bias", false);
  a.mlp_bias = f.boolean("mlp_bias", false);
  // Transformers 4.x splits the projections into pretraining_tp slices summed in another order.
  const nlohmann::json* tp = f.get("pretraining_tp");
  TITAN_CHECK(tp == nullptr || f.integer(*tp, "pretraining_tp") == 1, f.where(),
              ": pretraining_tp other than 1 is not supported");
  return a;
}

nlohmann::json write_llama_config(const ModelArgs& a, DType weights_dtype) {
  nlohmann::json c = hf::common_config_json(a, "llama", weights_dtype);
  c["attention_bias"] = a.attention_bias;
  c["mlp_bias"] = a.mlp_bias;
  c["pretraining_tp"] = 1;
  return c;
}

void validate_llama_args(const ModelArgs& a, const std::string& where) {
  TITAN_CHECK(!a.qk_norm, where, ": LlamaForCausalLM has no q/k norm (qk_norm = false)");
  TITAN_CHECK(a.o_proj_bias == a.attention_bias, where,
              ": LlamaForCausalLM has biases on q, k, v and o_proj together "
              "(attention_bias = o_proj_bias)");
  TITAN_CHECK(a.hidden_size % a.num_attention_heads == 0, where, ": hidden_size ", a.hidden_size,
              " is not a multiple of num_attention_heads ", a.num_attention_heads,
              " (LlamaConfig refuses it)");
}

}  // namespace titan
