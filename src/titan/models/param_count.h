// Parameter counts (spec §4.3), for `titan info`, MFU, flavor checks and `titan plan`: summed over
// the parameter specs a model of the dims is built from, cut by a parallelize plan to one rank's
// parts (the default plan: the whole model).
#pragma once

#include <cstdint>

#include "titan/models/model_args.h"
#include "titan/nn/parallel_plan.h"

namespace titan {

struct ParamCounts {
  int64_t total = 0;      // every parameter, lm_head counted once when tied
  int64_t active = 0;     // used per token: MoE counts k of E experts (router included)
  int64_t embedding = 0;  // embed_tokens + an untied lm_head
  int64_t non_embedding() const { return total - embedding; }
};

ParamCounts count_parameters(const ModelArgs& args, const ParallelizePlan& plan = {});

}  // namespace titan
