// torchtitan's data-parallel device mesh over the ranks of a job: dp_replicate x dp_shard ranks,
// the shard dimension inner (rank = replicate index * dp_shard + shard index). FSDP shards
// parameters, gradients and optimizer state over a shard group (the ranks of one replica); HSDP
// keeps dp_replicate such replicas and all-reduces their gradients over a replicate group (the
// ranks holding the same shard). Tensor, pipeline, context and expert parallelism are later
// dimensions; their degrees must be 1 for now.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "titan/distributed/communicator.h"

namespace titan {

// The [parallelism] degrees as configured (-1: the rest of the world).
struct ParallelDegrees {
  int64_t dp_replicate = 1, dp_shard = -1;
  int64_t tp = 1, pp = 1, cp = 1, ep = 1;
};

struct MeshDims {
  int64_t dp_replicate = 1, dp_shard = 1;
  int64_t dp() const { return dp_replicate * dp_shard; }
};

// Resolves dp_shard = -1 and checks that the degrees multiply to `world_size` (titan::Error,
// one line naming the [parallelism] keys, otherwise).
MeshDims resolve_mesh_dims(const ParallelDegrees& degrees, int64_t world_size);

class DeviceMesh {
 public:
  // `world` must outlive the mesh; its size is dims.dp().
  DeviceMesh(Communicator& world, const MeshDims& dims);

  const MeshDims& dims() const { return dims_; }
  int64_t replicate_index() const { return replicate_index_; }
  int64_t shard_index() const { return shard_index_; }
  Communicator& world() { return world_; }
  Communicator& shard_group() { return *shard_group_; }
  Communicator& replicate_group() { return *replicate_group_; }
  // "rank 3 of 4: dp_replicate 1 of 2, dp_shard 1 of 2"
  std::string describe() const;

 private:
  Communicator& world_;
  MeshDims dims_;
  int64_t replicate_index_ = 0, shard_index_ = 0;
  std::unique_ptr<Communicator> shard_group_, replicate_group_;
};

}  // namespace titan
