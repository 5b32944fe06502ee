#include "titan/models/registry.h"

#include "titan/core/error.h"
#include "titan/io/json_util.h"
#include "titan/models/llama/hf_config.h"
#include "titan/models/qwen2/hf_config.h"
#include "titan/models/qwen3/hf_config.h"

namespace titan {

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families = {
      {"Qwen3ForCausalLM", "qwen3", false, read_qwen3_config, write_qwen3_config,
       validate_qwen3_args},
      {"Qwen3MoeForCausalLM", "qwen3_moe", true, read_qwen3_moe_config, write_qwen3_moe_config,
       validate_qwen3_args},
      {"Qwen2ForCausalLM", "qwen2", false, read_qwen2_config, write_qwen2_config,
       validate_qwen2_args},
      {"LlamaForCausalLM", "llama", false, read_llama_config, write_llama_config,
       validate_llama_args},
  };
  return families;
}

const ModelFamily& model_family(const std::string& architecture, const std::string& where) {
  for (const ModelFamily& family : model_families()) {
    if (architecture == family.architecture) return family;
  }
  fail(where, ": architecture ", json_quote(architecture), " is not supported (",
       known_architectures(), ")");
}

const ModelFamily* model_family_by_type(const std::string& model_type) {
  for (const ModelFamily& family : model_families()) {
    if (model_type == family.model_type) return &family;
  }
  return nullptr;
}

std::string known_architectures() {
  std::string names;
  for (const ModelFamily& family : model_families()) {
    names += (names.empty() ? "" : ", ") + std::string(family.architecture);
  }
  return names;
}

}  // namespace titan
