// FSDP's sharding of a model's parameter groups (one group per FSDP unit: each transformer
// block, the embedding, [norm, lm_head]) over the shard group of a data-parallel mesh: each rank
// keeps a dim-0 shard of every parameter -- rows [r*c, (r+1)*c) of a parameter with d0 rows,
// c = ceil(d0 / N), the last ranks' missing rows zero padding -- with the matching shards of its
// gradient and of the AdamW moments. After the backward, each group's gradients are
// reduce-scattered over the shard group (and, under HSDP, all-reduced over the replicas); the
// optimizer updates the shards; the updated shards are all-gathered into the whole parameters.
//
// Not yet FSDP's memory: the whole parameters and gradients of every group stay allocated on
// every rank between steps (only the optimizer state is 1/N); gathering each unit just before its
// forward and freeing it after is the next step, through the model's per-layer hooks.
#pragma once

#include <cstdint>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/dist/mesh.h"
#include "titan/nn/param_group.h"

namespace titan {

class FullyShardedGroups {
 public:
  // `full` (with gradients allocated) and `mesh` must outlive this.
  FullyShardedGroups(std::vector<ParamGroup>& full, DeviceMesh& mesh);

  // Per group, this rank's shard of every parameter (same names, dim 0 = c), with gradients:
  // what the optimizer updates.
  std::vector<ParamGroup>& shards() { return shards_; }
  // The whole parameters -> this rank's shards (after initialisation or loading).
  void shard_parameters();
  // The whole gradients of every rank -> their sum's shard on each rank (reduce-scatter over the
  // shard group, then all-reduce over the replicate group).
  void reduce_gradients();
  // Every rank's shards -> the whole parameters on each rank (all-gather over the shard group).
  void gather_parameters();

 private:
  // rank's block (N x shard numel) <-> the whole group's layout
  void pack(float* blocks, const ParamGroup& full, const float* whole) const;
  void unpack(float* whole, const ParamGroup& full, const float* blocks) const;

  std::vector<ParamGroup>& full_;
  DeviceMesh& mesh_;
  std::vector<ParamGroup> shards_;
  Buffer staging_;  // N x the largest group's shard numel
};

}  // namespace titan
