// Hugging Face config.json <-> ModelArgs for every architecture of the model registry
// (models/registry.h: Qwen3, Qwen3-MoE, Qwen2, Llama; each family's own keys in
// models/<family>/hf_config.cpp), and the generation_config.json that goes beside it. Reading
// accepts what Transformers 4.x and 5.x write (rope_theta / rope_scaling or rope_parameters,
// num_experts or num_local_experts, eos as an int or a list), fills absent keys with the family's
// config class defaults, and refuses, by file and field, whatever the model cannot compute exactly.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/models/model_args.h"

namespace titan {

// config.json at `path`, or inside the folder `path`. Errors are one line naming the file and
// the field: unknown architecture (the known ones listed), a missing dim, a wrong JSON type, a
// non-integer or non-positive size, an unsupported rope type or feature (sliding window,
// dropout, pretraining_tp, an activation other than silu).
ModelArgs read_hf_config(const std::string& path);
// The same from parsed JSON; `where` names the source in errors.
ModelArgs model_args_from_hf_config(const nlohmann::json& config, const std::string& where);

// torch's dtype names: "float32", "bfloat16", "float16" (what torch_dtype / dtype hold).
std::string torch_dtype_name(DType dtype);

// Every field the architecture's HF config class has (Qwen3Config, Qwen3MoeConfig, Qwen2Config,
// LlamaConfig), plus architectures, model_type, and the weights' dtype as both torch_dtype (4.x)
// and dtype (5.x). RoPE is written both ways (rope_theta + rope_scaling, and rope_parameters) so
// either major version reads it.
nlohmann::json hf_config_json(const ModelArgs& args, DType weights_dtype);
void write_hf_config(const std::string& path, const ModelArgs& args, DType weights_dtype);

// generation_config.json: the token ids generate() stops and pads on, and sampling defaults.
struct GenerationConfig {
  int64_t bos_token_id = -1;  // -1: none
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = -1;  // -1: none
  bool do_sample = false;
  double temperature = 1.0;
  double top_p = 1.0;
  int64_t top_k = 50;  // 0: no top-k filtering
};

// Greedy decoding with the model's own bos / eos / pad ids.
GenerationConfig default_generation_config(const ModelArgs& args);
nlohmann::json hf_generation_config_json(const GenerationConfig& config);
void write_hf_generation_config(const std::string& path, const GenerationConfig& config);
// generation_config.json at `path`; missing fields keep the defaults above.
GenerationConfig read_hf_generation_config(const std::string& path);

}  // namespace titan
