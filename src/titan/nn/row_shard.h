// FSDP's cut of a parameter (distributed/fsdp.h): shard `index` of `count` holds rows
// [index * c, min((index + 1) * c, d0)) of a parameter with d0 rows along dim 0, c = ceil(d0 /
// count); rows past d0 are zero padding so every shard has c rows. count 1 is the whole parameter.
// Checkpoints and Hugging Face weights load into any cut (train/checkpoint.h,
// models/hf_checkpoint.h), which is how a run resumes on another number of ranks.
#pragma once

#include <algorithm>
#include <cstdint>

#include "titan/nn/param_group.h"

namespace titan {

struct RowShard {
  int64_t index = 0;
  int64_t count = 1;

  int64_t rows_per_shard(int64_t d0) const { return (d0 + count - 1) / count; }
  // The first global row this shard holds, and how many real (not padding) rows.
  int64_t first_row(int64_t d0) const { return std::min(index * rows_per_shard(d0), d0); }
  int64_t rows(int64_t d0) const { return std::min(rows_per_shard(d0), d0 - first_row(d0)); }
  // The shard's parameter: the same name, dim 0 cut to c rows.
  ParamSpec spec_of(const ParamSpec& whole) const {
    ParamSpec s = whole;
    s.shape[0] = rows_per_shard(whole.shape[0]);
    return s;
  }
};

}  // namespace titan
