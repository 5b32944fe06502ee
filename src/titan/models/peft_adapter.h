// PEFT's LoRA adapter folder, the form Hugging Face's PEFT saves and `PeftModel.from_pretrained`
// loads: adapter_config.json (peft_type "LORA", r, lora_alpha, target_modules, ...) and
// adapter_model.safetensors, whose keys are the adapter's parameter names under PEFT's prefix:
// base_model.model.model.layers.{i}.self_attn.q_proj.lora_A.weight (rank, in), ...lora_B.weight
// (out, rank); on a Qwen3-MoE model also the experts' stacked pairs under
// ...mlp.experts[.base_layer].lora_A.weight / lora_B.weight, named in "target_parameters"
// (models/lora.h ExpertLoraSite).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "titan/models/lora.h"
#include "titan/nn/param_group.h"

namespace titan {

// The LoRA options adapter_config.json in `dir` holds. A titan::Error naming the file and the key
// for a folder that is not a LoRA adapter or asks for what titan does not compute (DoRA,
// rsLoRA, per-module ranks, a regex target, biases, fan_in_fan_out, dropout is ignored: it only
// acts in training).
LoraOptions read_peft_adapter_config(const std::string& dir);
// Reads the adapter's A and B matrices from `dir` into `adapter` (converted to fp32): every key
// of the file must be one of the adapter's, with its shape, and every parameter present.
void load_peft_adapter(const std::string& dir, LoraAdapter& adapter);
// Brings one of an adapter's parameters (its group's index, its name) whole into `whole`: under
// tensor parallel the adapter holds cuts (models/lora.h), gathered from the ranks holding the
// others (Parallelism::gather_trained). `whole` is null on the ranks that do not write.
using AdapterTensorGather =
    std::function<void(size_t group, const std::string& param, float* whole)>;
// Writes `adapter` as a PEFT adapter folder at `dir` (atomically; replacing only an adapter folder
// titan wrote when `overwrite`), fp32 tensors; base_model_name_or_path = `base_model`. With
// `gather` each tensor is gathered whole into one room just before the writer reads it (one
// tensor whole at a time), in peft_adapter_read_order.
void write_peft_adapter(const std::string& dir, const LoraAdapter& adapter,
                        const std::string& base_model, bool overwrite,
                        const AdapterTensorGather& gather = {});
// The parameters a gathered write_peft_adapter asks for, in its order: what the ranks that do not
// write call the gather with.
std::vector<std::pair<size_t, std::string>> peft_adapter_read_order(const LoraAdapter& adapter);
// W += scaling * B A for every linear `adapter` adapts, and W_e += scaling * B_e A_e for every
// expert of its adapted stacked experts, into the model parameter groups `groups`
// (model_param_specs' layout): PEFT's merge_and_unload. The products are summed in fp64.
void merge_lora(const LoraAdapter& adapter, std::vector<ParamGroup>& groups);
// The same for the weights among `params` of one group (the export's run of a sharded model,
// gathered whole: models/hf_export.h ExportRun).
void merge_lora_into(const LoraAdapter& adapter, ParamGroup& group,
                     const std::vector<std::string>& params);
// The adapter in `dir` read and merged into `groups` of a model of `args` (titan eval and
// generate --adapter).
void merge_peft_adapter(const std::string& dir, const ModelArgs& args,
                        std::vector<ParamGroup>& groups);

}  // namespace titan
