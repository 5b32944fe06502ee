// A Hugging Face checkpoint checked against the model its config.json describes, and loaded into
// fp32 parameters. Everything is validated before the first parameter is written, so a bad
// checkpoint leaves the model as it was: every expected tensor present, none unexpected, each
// with the shape the config implies and a float dtype (F32, BF16, F16).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "titan/dispatch/overrides.h"
#include "titan/io/safetensors.h"
#include "titan/models/model_args.h"
#include "titan/models/state_dict_adapter.h"
#include "titan/nn/parallel_plan.h"
#include "titan/nn/param_group.h"
#include "titan/nn/shard.h"

namespace titan {

class CausalLM;

struct HfCheckpointTensor {
  HfKey key;                      // where it goes in the model
  const SafetensorsEntry* entry;  // where it is in the checkpoint
};

// The checkpoint's tensors one to one with hf_keys(args), in model order. A tied model's
// checkpoint may also hold lm_head.weight (some third-party exports keep it): it is accepted
// when it equals model.embed_tokens.weight value for value and then ignored; a different one is
// an error, since config.json and the weights then disagree about the model. Errors are one line
// naming the file, the tensor and the fault; `config_source` names where the dims came from
// ("config.json path") in shape errors.
std::vector<HfCheckpointTensor> match_hf_checkpoint(const ModelArgs& args,
                                                    const SafetensorsCheckpoint& checkpoint,
                                                    const std::string& config_source);

// Per parameter name, where a parameter read only in bf16 is loaded: its view's numel bf16 values
// in its own layout, rounded to nearest even from the folder's dtype (a bf16 folder's bits as
// stored).
using Bf16Destinations = std::unordered_map<std::string, uint16_t*>;

// Validates the checkpoint at `path` (a model folder, an index or one .safetensors file) against
// `args`, then converts every tensor into `groups` (laid out by model_param_specs(args), each
// parameter cut to its placement under `plan` -- tensor parallel's dim-0 or dim-1 cut -- and then
// to `shard`'s rows of that: FSDP loads a rank's rows only). Weights holding NaN or Inf are
// refused (models/nonfinite_weights.h) unless `allow_nonfinite`. The parameters `bf16` names go
// into their bf16 destinations instead (each its view's elements, cut as the view is, the padding
// rows zero), their views left untouched (a LoRA base held in bf16, train/lora_job.h: the model's
// copies, or FSDP's bf16 shards).
void load_hf_weights(const ModelArgs& args, std::vector<ParamGroup>& groups,
                     const std::string& path, const std::string& config_source,
                     bool allow_nonfinite = false, Shard shard = {},
                     const Bf16Destinations& bf16 = {}, const ParallelizePlan& plan = {});
// The model folder `dir` (its weights) into `model`, whose args must describe that folder.
void load_hf_weights(CausalLM& model, const std::string& dir, bool allow_nonfinite = false);
// The model folder `dir` as a ready model: config.json, then the weights checked against it
// before the model is allocated, then loaded; its matmuls compute in `compute_dtype`.
std::unique_ptr<CausalLM> load_hf_model(const std::string& dir,
                                        const std::vector<OverrideRule>& overrides = {},
                                        bool allow_nonfinite = false,
                                        DType compute_dtype = DType::f32);

// load_hf_model for bf16 inference (infer/weights.h), never holding a matmul weight in fp32: the
// model computes in bf16 and is made with its parameters released. `destinations(model,
// checkpoint)` -- called once the model exists and the checkpoint is checked, before anything is
// read -- names where each parameter held in bf16 goes: at least every one the model reads only
// in bf16 (CausalLM::bf16_only_params), and any other it chooses (an embedding stored in bf16).
// Those are converted from the folder into their destinations; only the other views are committed
// and loaded in fp32 (norms, biases, routers). The same checks, and the same errors, as
// load_hf_model.
using Bf16DestinationsOf = std::function<Bf16Destinations(CausalLM&, const SafetensorsCheckpoint&)>;
std::unique_ptr<CausalLM> load_hf_model_bf16_only(const std::string& dir, bool allow_nonfinite,
                                                  const Bf16DestinationsOf& destinations);

// Whether a model loaded this way holds its embedding in bf16 too: when `checkpoint` stores it in
// bf16 (held exactly) and the model's embedding kernel looks rows up in bf16. An embedding stored
// in fp32 stays fp32, as a live model's lookup reads it.
bool embedding_held_in_bf16(const CausalLM& model, const SafetensorsCheckpoint& checkpoint);

}  // namespace titan
