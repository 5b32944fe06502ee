// Parameter counts from the dims alone (spec §4.3), for `titan info`, MFU and flavor checks.
#pragma once

#include <cstdint>

#include "titan/models/model_args.h"

namespace titan {

struct ParamCounts {
  int64_t total = 0;      // every parameter, lm_head counted once when tied
  int64_t active = 0;     // used per token: MoE counts k of E experts (router included)
  int64_t embedding = 0;  // embed_tokens + an untied lm_head
  int64_t non_embedding() const { return total - embedding; }
};

ParamCounts count_parameters(const ModelArgs& args);

}  // namespace titan
