// One rank's cut of a parameter along one dimension (torchtitan's DTensor `Shard(dim)`): part
// `index` of `count` holds indices [index * c, min((index + 1) * c, d)) of a dimension of size d,
// c = ceil(d / count); indices past d are zero padding so every part has c of them. count 1 is the
// whole parameter.
//
// FSDP cuts dimension 0 (distributed/fsdp.h); checkpoints and Hugging Face weights load into any
// cut of dimension 0 (train/checkpoint.h, models/hf_checkpoint.h), which is how a run resumes on
// another number of ranks. Tensor parallel's placements (models/parallelize.h) cut dimension 0
// (column-wise, vocabulary, experts) or 1 (row-wise) into equal parts.
#pragma once

#include <algorithm>
#include <cstdint>

#include "titan/nn/param_group.h"

namespace titan {

struct Shard {
  int64_t index = 0;
  int64_t count = 1;
  int64_t dim = 0;

  int64_t per_shard(int64_t d) const { return (d + count - 1) / count; }
  // The first global index along `dim` this part holds, and how many real (not padding) ones.
  int64_t first(int64_t d) const { return std::min(index * per_shard(d), d); }
  int64_t size(int64_t d) const { return std::min(per_shard(d), d - first(d)); }
  // The part's parameter: the same name, `dim` cut to c.
  ParamSpec spec_of(const ParamSpec& whole) const {
    ParamSpec s = whole;
    s.shape[static_cast<size_t>(dim)] = per_shard(whole.shape[static_cast<size_t>(dim)]);
    return s;
  }
};

}  // namespace titan
