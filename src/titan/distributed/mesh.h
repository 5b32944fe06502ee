// torchtitan's device mesh over the ranks of a job: dp_replicate x dp_shard x tp ranks, the
// tensor-parallel dimension innermost so that a TP group shares a machine (rank = (replicate index
// * dp_shard + shard index) * tp + tp index). FSDP shards parameters, gradients and optimizer
// state over a shard group (the ranks of one replica with the same tp index); HSDP keeps
// dp_replicate such replicas and all-reduces their gradients over a replicate group (the ranks
// holding the same shard); the TP group (the ranks of one data-parallel rank) runs one model cut
// over its ranks (models/parallelize.h). Expert parallel borrows its ranks from dp_shard x tp, as
// torchtitan does: flattening (shard index, tp index) into one index j over dp_shard * tp, the EP
// group of a rank is the ep consecutive j's around it (its EP index j % ep), and the ranks holding
// the same experts are those with its EP index in every replica and every other EP group.
// Pipeline and context parallelism are later dimensions; their degrees must be 1 for now.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/distributed/communicator.h"

namespace titan {

// The [parallelism] degrees as configured (-1: the rest of the world).
struct ParallelDegrees {
  int64_t dp_replicate = 1, dp_shard = -1;
  int64_t tp = 1, pp = 1, cp = 1, ep = 1;
};

struct MeshDims {
  int64_t dp_replicate = 1, dp_shard = 1, tp = 1;
  int64_t ep = 1;  // borrowed from dp_shard x tp: no ranks of its own
  int64_t dp() const { return dp_replicate * dp_shard; }  // the data-parallel ranks
  int64_t world() const { return dp() * tp; }
  // Whether FSDP shards the parameters over dp_shard: not with expert parallel over the whole
  // of dp_shard x tp (ep == dp_shard x tp), where each rank holds its experts whole and the other
  // parameters (or their TP cuts) replicated (DDP over dp_shard); under a smaller EP degree the
  // experts are sharded over the dp_shard x tp / ep ranks holding the same experts, the rest over
  // dp_shard.
  bool fsdp() const { return dp_shard > 1 && dp_shard * tp > ep; }
};

// Resolves dp_shard = -1 (the world over dp_replicate x tp) and checks that the degrees multiply
// to `world_size` and that the EP degree divides dp_shard x tp (titan::Error, one line naming the
// [parallelism] keys, otherwise).
MeshDims resolve_mesh_dims(const ParallelDegrees& degrees, int64_t world_size);

class DeviceMesh {
 public:
  // `world` must outlive the mesh; its size is dims.world().
  DeviceMesh(Communicator& world, const MeshDims& dims);

  const MeshDims& dims() const { return dims_; }
  int64_t replicate_index() const { return replicate_index_; }
  int64_t shard_index() const { return shard_index_; }
  int64_t tp_index() const { return tp_index_; }
  // This rank's place in its EP group (0 without expert parallel): which experts it holds.
  int64_t ep_index() const { return ep_index_; }
  // Whether this rank holds a cut of the model rank 0 holds a cut of: it is in rank 0's EP group
  // under expert parallel, else in rank 0's TP group (dp_rank() == 0). What a save or an export
  // gathers whole onto rank 0 comes from these ranks.
  bool shares_model_with_rank0() const { return shares_model_with_rank0_; }
  // This rank's place among the data-parallel ranks: which rows of a global batch it trains on
  // (the TP ranks of one group read the same).
  int64_t dp_rank() const { return replicate_index_ * dims_.dp_shard + shard_index_; }
  Communicator& world() { return world_; }
  Communicator& shard_group() { return *shard_group_; }
  Communicator& replicate_group() { return *replicate_group_; }
  // The ranks of this rank's model, one per tp index (the world itself without TP).
  Communicator& tp_group() { return *tp_group_; }
  // The data-parallel ranks with this rank's tp index: what a batch's sums and the replicated
  // gradients are reduced over (the world itself without TP).
  Communicator& dp_group() { return dp_group_ ? *dp_group_ : world_; }
  // Under expert parallel (ep > 1; else null): the ranks that exchange tokens for experts, one
  // per EP index; and the ranks holding this rank's experts, over which their gradients reduce.
  Communicator* ep_group() { return ep_group_.get(); }
  Communicator* same_experts_group() { return same_experts_group_.get(); }
  // Under FSDP x EP (fsdp() and ep > 1; else null): the ranks of this replica holding this rank's
  // experts (same_experts_group within one replica), over which FSDP shards them.
  Communicator* expert_shard_group() { return expert_shard_group_.get(); }
  // The mesh's groups by role, each object once, for what their collectives moved
  // (Communicator::counts): "dp" (dp_group(), the world itself without TP), "dp_shard",
  // "dp_replicate", "tp", "world" under TP, "ep" and "same_experts" under EP, and "expert_shard"
  // under FSDP x EP.
  std::vector<std::pair<std::string, const Communicator*>> named_groups() const;
  // "rank 3 of 4: dp_replicate 1 of 2, dp_shard 1 of 2", then ", tp 1 of 2" under TP and
  // ", ep 1 of 2" under EP
  std::string describe() const;

 private:
  Communicator& world_;
  MeshDims dims_;
  int64_t replicate_index_ = 0, shard_index_ = 0, tp_index_ = 0, ep_index_ = 0;
  bool shares_model_with_rank0_ = true;
  std::unique_ptr<Communicator> shard_group_, replicate_group_, tp_group_, dp_group_;
  std::unique_ptr<Communicator> ep_group_, same_experts_group_, expert_shard_group_;
};

}  // namespace titan
