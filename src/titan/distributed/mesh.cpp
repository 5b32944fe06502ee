#include "titan/distributed/mesh.h"

#include "titan/core/error.h"

namespace titan {

MeshDims resolve_mesh_dims(const ParallelDegrees& d, int64_t world_size) {
  TITAN_CHECK(world_size >= 1, "a world of ", world_size, " ranks");
  const struct {
    const char* key;
    int64_t degree;
  } later[] = {{"tensor_parallel_degree", d.tp},
               {"pipeline_parallel_degree", d.pp},
               {"context_parallel_degree", d.cp},
               {"expert_parallel_degree", d.ep}};
  for (const auto& [key, degree] : later) {
    TITAN_CHECK(degree == 1, "parallelism.", key, " = ", degree,
                ": only data parallelism (FSDP / HSDP) is built so far; set it to 1");
  }
  TITAN_CHECK(d.dp_replicate >= 1, "parallelism.data_parallel_replicate_degree = ", d.dp_replicate,
              ": must be at least 1");
  TITAN_CHECK(d.dp_shard >= 1 || d.dp_shard == -1,
              "parallelism.data_parallel_shard_degree = ", d.dp_shard,
              ": must be at least 1, or -1 for the rest of the world");
  MeshDims dims;
  dims.dp_replicate = d.dp_replicate;
  if (d.dp_shard == -1) {
    TITAN_CHECK(world_size % d.dp_replicate == 0,
                "parallelism.data_parallel_replicate_degree = ", d.dp_replicate,
                " does not divide the world of ", world_size, " ranks");
    dims.dp_shard = world_size / d.dp_replicate;
  } else {
    dims.dp_shard = d.dp_shard;
  }
  TITAN_CHECK(dims.dp() == world_size, "parallelism degrees: data_parallel_replicate_degree ",
              dims.dp_replicate, " x data_parallel_shard_degree ", dims.dp_shard, " = ", dims.dp(),
              " ranks, but the world has ", world_size,
              world_size == 1 ? " (run under mpirun, or titan launch, for more)" : "");
  return dims;
}

DeviceMesh::DeviceMesh(Communicator& world, const MeshDims& dims) : world_(world), dims_(dims) {
  TITAN_CHECK(world.size() == dims.dp(), "a mesh of ", dims.dp(), " ranks over a world of ",
              world.size());
  replicate_index_ = world.rank() / dims.dp_shard;
  shard_index_ = world.rank() % dims.dp_shard;
  shard_group_ = world.split(static_cast<int>(replicate_index_), static_cast<int>(shard_index_));
  replicate_group_ =
      world.split(static_cast<int>(shard_index_), static_cast<int>(replicate_index_));
}

std::string DeviceMesh::describe() const {
  return "rank " + std::to_string(world_.rank()) + " of " + std::to_string(world_.size()) +
         ": dp_replicate " + std::to_string(replicate_index_) + " of " +
         std::to_string(dims_.dp_replicate) + ", dp_shard " + std::to_string(shard_index_) +
         " of " + std::to_string(dims_.dp_shard);
}

}  // namespace titan
