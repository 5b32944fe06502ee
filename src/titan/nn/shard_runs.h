// Where a cut's elements lie in the row-major whole: a parameter cut by one Shard or by several in
// turn (tensor parallel's placement, then FSDP's dim-0 cut of that part), as runs of contiguous
// elements. The loaders read a cut's elements of a whole tensor through them, the tensor-parallel
// initialisation and export move parts to and from whole parameters with them.
#pragma once

#include <cstdint>
#include <vector>

#include "titan/core/tensor.h"
#include "titan/nn/shard.h"

namespace titan {

// `count` elements at `whole_first` of the whole and at `part_first` of the part.
struct ShardRun {
  int64_t whole_first = 0, part_first = 0, count = 0;
};

// The part of `whole` that `cuts` leave, each applied to the part the ones before it left (its
// dimension's padded extent cut into `count` pieces of ceil(extent / count)).
struct ShardBox {
  Shape part;                  // the part's shape, padding included
  std::vector<ShardRun> runs;  // its real elements, ascending; the rest is padding
  int64_t real_numel() const;
};
ShardBox shard_box(const Shape& whole, const std::vector<Shard>& cuts);

// The part's real elements copied out of `whole` into `part` (padding zeroed), and back.
void copy_part_out(const ShardBox& box, const float* whole, float* part);
void copy_part_in(const ShardBox& box, const float* part, float* whole);

}  // namespace titan
