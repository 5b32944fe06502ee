// The decoder's parallelize plan: torchtitan's tensor-parallel plan for Llama 3 and Qwen3 (and the
// expert-parallel one for Qwen3-MoE) written as module rules (nn/parallel_plan.h), and the local
// parameter specs it gives a rank -- what the model allocates, the loaders fill and the plan
// counts.
//
//   model.embed_tokens                    vocab      (torchtitan: RowwiseParallel on it)
//   model.layers.*.input_layernorm        sequence
//   model.layers.*.self_attn.{q,k,v}_proj colwise    (whole heads per rank)
//   model.layers.*.self_attn.{q,k}_norm   replicate  (applied to the rank's local heads)
//   model.layers.*.self_attn.o_proj       rowwise
//   model.layers.*.post_attention_layernorm sequence
//   model.layers.*.mlp.{gate,up}_proj     colwise
//   model.layers.*.mlp.down_proj          rowwise
//   model.layers.*.mlp.gate               replicate  (the router: torchtitan's NoParallel)
//   model.layers.*.mlp.experts.*          expert when expert_parallel_degree > 1; else the experts'
//                                         gate/up colwise and down rowwise over the TP axis
//   model.norm                            sequence
//   lm_head                               vocab      (ColwiseParallel with loss_parallel)
#pragma once

#include <vector>

#include "titan/models/model_args.h"
#include "titan/models/state_dict_adapter.h"
#include "titan/nn/parallel_plan.h"
#include "titan/nn/param_group.h"

namespace titan {

// The plan of a decoder of `args` on `axes`, checked: the TP degree must divide the attention
// heads, the key/value heads (torchtitan's GQA rule: whole kv heads per rank), the MLP widths
// and the vocabulary; the EP degree the experts. A broken rule is a titan::Error naming the key
// and the two numbers. Degrees of 1 give every parameter whole: the model as built today.
ParallelizePlan parallelize_decoder(const ModelArgs& args, const ParallelAxes& axes);

// model_param_specs(args) with every parameter cut to this rank's part under `plan`, in the same
// groups and order.
std::vector<ParamGroupSpec> local_param_specs(const ModelArgs& args, const ParallelizePlan& plan);

// The whole parameter a local one (`local`, cut by `plan`) is part of: its cut dimension times the
// degree (the plan's cuts are exact).
ParamSpec whole_param_spec(const ParamSpec& local, const ParallelizePlan& plan);

// HF init of `group`, a parameter group of local_param_specs under `plan`: each parameter this
// rank's cut of the whole model's initialisation (initialize_param_group's bits, drawn whole
// one parameter at a time and cut), deterministic in `seed`.
void initialize_local_group(ParamGroup& group, const ModelArgs& args, uint64_t seed,
                            const ParallelizePlan& plan);

}  // namespace titan
