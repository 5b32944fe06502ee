#include "titan/nn/shard_runs.h"

#include <algorithm>
#include <cstring>

#include "titan/core/error.h"

namespace titan {

int64_t ShardBox::real_numel() const {
  int64_t n = 0;
  for (const ShardRun& r : runs) n += r.count;
  return n;
}

ShardBox shard_box(const Shape& whole, const std::vector<Shard>& cuts) {
  const size_t rank = whole.size();
  // Per dimension, the real elements [first, first + size) of the whole the part holds, and the
  // part's extent (size plus padding).
  std::vector<int64_t> first(rank, 0), size(whole), extent(whole);
  for (const Shard& c : cuts) {
    if (c.count == 1) continue;
    TITAN_CHECK(c.dim >= 0 && static_cast<size_t>(c.dim) < rank, "a cut along dimension ", c.dim,
                " of a tensor of shape ", shape_str(whole));
    const auto d = static_cast<size_t>(c.dim);
    const int64_t per = c.per_shard(extent[d]);
    const int64_t at = c.index * per;
    first[d] += std::min(at, size[d]);
    size[d] = std::max<int64_t>(0, std::min(per, size[d] - at));
    extent[d] = per;
  }
  ShardBox box;
  box.part = extent;
  // The runs span the innermost dimensions the part holds whole and unpadded, plus one more.
  size_t inner = rank;  // the first dimension of the run's span
  int64_t span = 1;     // whole elements per index of dimension inner - 1
  while (inner > 0 && first[inner - 1] == 0 && size[inner - 1] == whole[inner - 1] &&
         extent[inner - 1] == whole[inner - 1]) {
    span *= whole[--inner];
  }
  if (inner == 0) {
    box.runs.push_back({0, 0, span});
    return box;
  }
  const size_t lead = inner - 1;  // the dimension each run covers `size[lead]` indices of
  std::vector<int64_t> whole_stride(rank, 1), part_stride(rank, 1);
  for (size_t d = rank - 1; d > 0; --d) {
    whole_stride[d - 1] = whole_stride[d] * whole[d];
    part_stride[d - 1] = part_stride[d] * extent[d];
  }
  for (size_t d = 0; d <= lead; ++d) {
    if (size[d] == 0) return box;
  }
  std::vector<int64_t> index(lead, 0);  // over the dimensions before lead
  while (true) {
    ShardRun run;
    run.whole_first = first[lead] * whole_stride[lead];
    run.part_first = 0;
    for (size_t d = 0; d < lead; ++d) {
      run.whole_first += (first[d] + index[d]) * whole_stride[d];
      run.part_first += index[d] * part_stride[d];
    }
    run.count = size[lead] * span;
    box.runs.push_back(run);
    size_t d = lead;
    while (d > 0 && ++index[d - 1] == size[d - 1]) index[--d] = 0;
    if (d == 0) break;
  }
  return box;
}

void copy_part_out(const ShardBox& box, const float* whole, float* part) {
  if (box.real_numel() != shape_numel(box.part)) {
    std::fill(part, part + shape_numel(box.part), 0.0f);
  }
  for (const ShardRun& r : box.runs) {
    std::memcpy(part + r.part_first, whole + r.whole_first,
                static_cast<size_t>(r.count) * sizeof(float));
  }
}

void copy_part_in(const ShardBox& box, const float* part, float* whole) {
  for (const ShardRun& r : box.runs) {
    std::memcpy(whole + r.whole_first, part + r.part_first,
                static_cast<size_t>(r.count) * sizeof(float));
  }
}

}  // namespace titan
