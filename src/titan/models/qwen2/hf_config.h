// Qwen2ForCausalLM (Qwen2, Qwen2.5) config.json <-> ModelArgs (models/registry.h).
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "titan/models/hf_config_common.h"

namespace titan {

ModelArgs read_qwen2_config(const hf::Fields& config);
nlohmann::json write_qwen2_config(const ModelArgs& args, DType weights_dtype);
// Biases on q, k, v and none on o_proj or the MLP; no q/k norm.
void validate_qwen2_args(const ModelArgs& args, const std::string& where);

}  // namespace titan
