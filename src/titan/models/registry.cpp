#include "titan/models/registry.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/io/json_util.h"
#include "titan/models/decoder_lm.h"
#include "titan/models/llama/hf_config.h"
#include "titan/models/qwen2/hf_config.h"
#include "titan/models/qwen3/hf_config.h"

namespace titan {

const std::vector<ModelFamily>& model_families() {
  static const std::vector<ModelFamily> families = {
      {"Qwen3ForCausalLM", "qwen3", "qwen3", false, read_qwen3_config, write_qwen3_config,
       validate_qwen3_args, make_decoder_lm},
      {"Qwen3MoeForCausalLM", "qwen3_moe", "qwen3", true, read_qwen3_moe_config,
       write_qwen3_moe_config, validate_qwen3_args, make_decoder_lm},
      {"Qwen2ForCausalLM", "qwen2", "qwen2", false, read_qwen2_config, write_qwen2_config,
       validate_qwen2_args, make_decoder_lm},
      {"LlamaForCausalLM", "llama", "llama3", false, read_llama_config, write_llama_config,
       validate_llama_args, make_decoder_lm},
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

const ModelFamily* model_family_by_name(const std::string& name) {
  for (const ModelFamily& family : model_families()) {
    if (name == family.name) return &family;
  }
  return nullptr;
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

std::string known_model_names() {
  std::vector<std::string> seen;
  std::string names;
  for (const ModelFamily& family : model_families()) {
    if (std::find(seen.begin(), seen.end(), family.name) != seen.end()) continue;
    seen.emplace_back(family.name);
    names += (names.empty() ? "" : ", ") + seen.back();
  }
  return names;
}

std::unique_ptr<CausalLM> make_model(const ModelArgs& args,
                                     const std::vector<OverrideRule>& overrides,
                                     DType compute_dtype, Residency params,
                                     const ParallelizePlan& plan) {
  return model_family(args.architecture, "model")
      .make(args, overrides, compute_dtype, params, plan);
}

}  // namespace titan
