// A model's parameter groups sharded by FSDP (distributed/fsdp.h): the trainer's wiring of the two,
// which the plan's tests repeat.
#pragma once

#include <string>
#include <vector>

#include "titan/distributed/fsdp.h"
#include "titan/models/causal_lm.h"

namespace titan {

// Installs `fsdp` as `model`'s ParamGroupHooks. Under bf16 compute the parameters the model reads
// only in bf16 (CausalLM::bf16_only_params: the matmul weights but a tied embedding) are gathered
// in bf16 straight into its copies, as torchtitan's FSDP2 with mixed_precision_param = bfloat16,
// and for the loss a tied embedding too (CausalLM::copied_params: the lm_head reads its copy).
void shard_model(CausalLM& model, FullyShardedGroups& fsdp);
// Per group, the names of the parameters `model` reads only in bf16 (CausalLM::bf16_only_params):
// what FSDP holds in bf16 only for a frozen base held in bf16 (FullyShardedGroups' bf16_shards).
std::vector<std::vector<std::string>> bf16_only_param_names(CausalLM& model);

}  // namespace titan
