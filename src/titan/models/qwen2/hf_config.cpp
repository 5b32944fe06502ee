// Qwen2: Qwen3's block without q/k norm, with biases on q, k and v that Qwen2Attention always
// has (config.json has no key for them) and none on o_proj. Qwen2Config has no head_dim key, but
// the attention reads one when config.json carries it.
#include "titan/models/qwen2/hf_config.h"

#include "titan/core/error.h"

namespace titan {

ModelArgs read_qwen2_config(const hf::Fields& f) {
  ModelArgs a = hf::read_common(f, {});
  a.intermediate_size = f.size("intermediate_size");
  a.qk_norm = false;
  a.attention_bias = true;
  a.o_proj_bias = a.mlp_bias = false;
  hf::refuse_sliding_window(f, a);
  return a;
}

nlohmann::json write_qwen2_config(const ModelArgs& a, DType weights_dtype) {
  nlohmann::json c = hf::common_config_json(a, "qwen2", weights_dtype);
  hf::write_no_sliding_window(a, c, true);
  return c;
}

void validate_qwen2_args(const ModelArgs& a, const std::string& where) {
  TITAN_CHECK(!a.qk_norm && a.attention_bias && !a.o_proj_bias && !a.mlp_bias, where,
              ": Qwen2ForCausalLM has biases on q, k, v only and no q/k norm (qk_norm = false, "
              "attention_bias = true, o_proj_bias = mlp_bias = false)");
}

}  // namespace titan
