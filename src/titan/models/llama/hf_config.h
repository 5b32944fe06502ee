// LlamaForCausalLM (Llama 2, 3.x) config.json <-> ModelArgs (models/registry.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "titan/models/hf_config_common.h"

namespace titan {

ModelArgs read_llama_config(const hf::Fields& config);
nlohmann::json write_llama_config(const ModelArgs& args, DType weights_dtype);
// No q/k norm; attention_bias on q, k, v and o together; mlp_bias free; heads divide hidden_size.
void validate_llama_args(const ModelArgs& args, const std::string& where);

}  // namespace titan
