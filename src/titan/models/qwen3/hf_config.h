// Qwen3ForCausalLM and Qwen3MoeForCausalLM config.json <-> ModelArgs (the model registry's
// entries, models/registry.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "titan/models/hf_config_common.h"

namespace titan {

ModelArgs read_qwen3_config(const hf::Fields& config);
ModelArgs read_qwen3_moe_config(const hf::Fields& config);
nlohmann::json write_qwen3_config(const ModelArgs& args, DType weights_dtype);
nlohmann::json write_qwen3_moe_config(const ModelArgs& args, DType weights_dtype);
// q/k norm always; attention_bias on q, k, v and o together; no MLP bias (experts have none).
void validate_qwen3_args(const ModelArgs& args, const std::string& where);

}  // namespace titan
