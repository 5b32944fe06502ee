// Hugging Face state-dict keys <-> titan parameters (spec §3). Parameter names are the HF keys
// themselves (`model.` prefix included) with one exception: MoE experts live stacked, one tensor
// per projection and layer, for the grouped-experts kernel,
//   model.layers.{i}.mlp.experts.gate_proj  (E, Im, h)
//   model.layers.{i}.mlp.experts.up_proj    (E, Im, h)
//   model.layers.{i}.mlp.experts.down_proj  (E, h, Im)
// and are split into / stacked from HF's per-expert keys model.layers.{i}.mlp.experts.{e}.
// {gate,up,down}_proj.weight at the checkpoint edge. Expert e is the contiguous slice [e] of the
// stacked tensor, so every HF key is one contiguous range of one parameter. A tied model has no
// lm_head parameter and no lm_head.weight key (the lm_head reads model.embed_tokens.weight).
//
// Everything here is derived from ModelArgs alone, so it serves the model (models/decoder_lm.h:
// every family, dense and MoE, with their biases and q/k norms) and tools that only move
// parameters.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "titan/io/safetensors_writer.h"
#include "titan/models/model_args.h"
#include "titan/nn/param_group.h"

namespace titan {

// One flat parameter group's worth of specs, as the model groups them (torchtitan's FSDP units):
// "model.embed_tokens" first, one group per decoder layer ("model.layers.{i}"), then
// "model.norm+lm_head"; a tied model has one first group "model.embed_tokens+norm+lm_head" and no
// last one. The order is Hugging Face's state-dict order too.
struct ParamGroupSpec {
  std::string name;
  std::vector<ParamSpec> params;

  // The parameter named `param` (a model's group may hold its views in another order: bf16 FSDP
  // units put the weights read only in bf16 last); an error names the group when it has none.
  const ParamSpec& param(const std::string& param) const;
};

std::vector<ParamGroupSpec> model_param_specs(const ModelArgs& args);
// The index in model_param_specs of decoder layer `layer`'s group: 1 + layer (the embedding's
// is 0).
int64_t layer_group_index(int64_t layer);
// The index in model_param_specs of the group holding [norm, lm_head]: the last, or 0 (the
// embedding's) when tied.
int64_t head_group_index(const ModelArgs& args);
// The groups of model_param_specs, allocated and zeroed: the parameters of a model that is only
// stored, converted or initialised (no module tree, no kernels).
std::vector<ParamGroup> make_param_groups(const ModelArgs& args);
// HF init (normal(0, initializer_range), norms 1, biases 0), deterministic in `seed`, as the
// model does.
void initialize_param_groups(std::vector<ParamGroup>& groups, const ModelArgs& args, uint64_t seed);
// One of them (FSDP initialises a unit at a time: distributed/fsdp.h).
void initialize_param_group(ParamGroup& group, const ModelArgs& args, uint64_t seed);

// One HF tensor and where it lives: elements [offset, offset + numel(shape)) of parameter
// `param`, in row-major order.
struct HfKey {
  std::string key;    // e.g. model.layers.0.mlp.experts.3.up_proj.weight
  Shape shape;        // on disk, e.g. (Im, h)
  std::string param;  // e.g. model.layers.0.mlp.experts.up_proj
  int64_t offset = 0;
};

// The HF keys parameter `param` is stored under: one with the same name and shape, or E
// per-expert keys for a stacked expert tensor.
std::vector<HfKey> hf_keys_for(const ParamSpec& param);
// Every HF key of the model, in model order (group by group, parameter by parameter).
std::vector<HfKey> hf_keys(const ModelArgs& args);

// The parameters as an HF state dict: fp32 views into the buffers of `groups` (the model's, whose
// views may stand in another order within a group) under HF keys, in model order, ready for the
// safetensors writer. The views live as long as the groups.
std::vector<SafetensorsTensor> hf_state_dict(const ModelArgs& args,
                                             const std::vector<ParamGroup>& groups);

}  // namespace titan
