// The model families titan computes, keyed by Hugging Face's `architectures` entry: each one's
// model_type, its name in a job config, whether it is MoE, how its config.json maps to ModelArgs
// and back (models/<family>/hf_config.cpp), and what computes it (make_model). Adding a family is
// a folder plus one entry here.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/models/causal_lm.h"
#include "titan/models/model_args.h"
#include "titan/nn/parallel_plan.h"

namespace titan {

namespace hf {
class Fields;
}

struct ModelFamily {
  const char* architecture;  // Hugging Face's architectures[0]: "LlamaForCausalLM"
  const char* model_type;    // config.json's model_type: "llama"
  const char* name;          // model.name in a job config, torchtitan's where it has one: "llama3"
  bool moe;                  // experts (num_experts > 0) in every model of the family
  // config.json's fields -> ModelArgs (architecture and validation are the caller's): the
  // family's keys, its class defaults, its feature flags, its refusals.
  ModelArgs (*read_config)(const hf::Fields& config);
  // ModelArgs -> what the family's Transformers config class writes; `weights_dtype` is a torch
  // dtype name's source (models/hf_config.h).
  nlohmann::json (*write_config)(const ModelArgs& args, DType weights_dtype);
  // Throws, naming `where`, when `args` is not a model of the family: feature flags (qk_norm,
  // biases) it does not have, dims its config class refuses.
  void (*validate)(const ModelArgs& args, const std::string& where);
  // The model, parameters allocated, not initialised (make_model).
  std::unique_ptr<CausalLM> (*make)(const ModelArgs& args,
                                    const std::vector<OverrideRule>& overrides, DType compute_dtype,
                                    Residency params, const ParallelizePlan& plan);
};

const std::vector<ModelFamily>& model_families();
// The family registered for `architecture`; an unknown one is refused with one line, prefixed by
// `where`, that lists the known architectures.
const ModelFamily& model_family(const std::string& architecture, const std::string& where);
// The first family whose model.name this is ("qwen3" names Qwen3 and Qwen3-MoE), or nullptr.
const ModelFamily* model_family_by_name(const std::string& name);
// The family whose model_type this is, or nullptr.
const ModelFamily* model_family_by_type(const std::string& model_type);
// "Qwen3ForCausalLM, Qwen3MoeForCausalLM, ..." for messages.
std::string known_architectures();
// "qwen3, qwen2, llama3": the model.name values, each once, for messages.
std::string known_model_names();

// The model of `args.architecture`, its parameters allocated but not initialised; overrides
// rebind kernel slots (what they did is in override_report()), each checked against the dtype its
// slot computes in. Residency::released: every group's parameters and gradients start handed back
// (FSDP, distributed/fsdp.h: a rank holds whole units only in flight). `plan`: the parallelize
// plan (models/parallelize.h) whose local parts of the parameters this rank allocates; the
// default, every parameter whole.
std::unique_ptr<CausalLM> make_model(const ModelArgs& args,
                                     const std::vector<OverrideRule>& overrides = {},
                                     DType compute_dtype = DType::f32,
                                     Residency params = Residency::committed,
                                     const ParallelizePlan& plan = {});

}  // namespace titan
