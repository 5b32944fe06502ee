#include "titan/distributed/mesh.h"

#include "titan/core/error.h"

namespace titan {

MeshDims resolve_mesh_dims(const ParallelDegrees& d, int64_t world_size) {
  TITAN_CHECK(world_size >= 1, "a world of ", world_size, " ranks");
  const struct {
    const char* key;
    int64_t degree;
  } later[] = {{"pipeline_parallel_degree", d.pp}, {"context_parallel_degree", d.cp}};
  for (const auto& [key, degree] : later) {
    TITAN_CHECK(degree == 1, "parallelism.", key, " = ", degree,
                ": only data, tensor and expert parallelism are built so far; set it to 1");
  }
  TITAN_CHECK(d.ep >= 1, "parallelism.expert_parallel_degree = ", d.ep, ": must be at least 1");
  TITAN_CHECK(d.tp >= 1, "parallelism.tensor_parallel_degree = ", d.tp, ": must be at least 1");
  TITAN_CHECK(d.dp_replicate >= 1, "parallelism.data_parallel_replicate_degree = ", d.dp_replicate,
              ": must be at least 1");
  TITAN_CHECK(d.dp_shard >= 1 || d.dp_shard == -1,
              "parallelism.data_parallel_shard_degree = ", d.dp_shard,
              ": must be at least 1, or -1 for the rest of the world");
  MeshDims dims;
  dims.dp_replicate = d.dp_replicate;
  dims.tp = d.tp;
  if (d.dp_shard == -1) {
    if (d.tp == 1) {
      TITAN_CHECK(world_size % d.dp_replicate == 0,
                  "parallelism.data_parallel_replicate_degree = ", d.dp_replicate,
                  " does not divide the world of ", world_size, " ranks");
    } else {
      TITAN_CHECK(world_size % (d.dp_replicate * d.tp) == 0,
                  "parallelism.data_parallel_replicate_degree = ", d.dp_replicate,
                  " x tensor_parallel_degree = ", d.tp, " does not divide the world of ",
                  world_size, " ranks");
    }
    dims.dp_shard = world_size / (d.dp_replicate * d.tp);
  } else {
    dims.dp_shard = d.dp_shard;
  }
  const std::string tp_factor =
      d.tp == 1 ? "" : " x tensor_parallel_degree " + std::to_string(d.tp);
  TITAN_CHECK(dims.world() == world_size, "parallelism degrees: data_parallel_replicate_degree ",
              dims.dp_replicate, " x data_parallel_shard_degree ", dims.dp_shard, tp_factor, " = ",
              dims.world(), " ranks, but the world has ", world_size,
              world_size == 1 ? " (run under mpirun, or titan launch, for more)" : "");
  TITAN_CHECK((dims.dp_shard * dims.tp) % d.ep == 0, "parallelism.expert_parallel_degree = ", d.ep,
              " does not divide data_parallel_shard_degree ", dims.dp_shard,
              d.tp == 1 ? " (expert parallel borrows its ranks from it)"
                        : " x tensor_parallel_degree " + std::to_string(d.tp) + " = " +
                              std::to_string(dims.dp_shard * dims.tp) +
                              " (expert parallel borrows its ranks from them)");
  dims.ep = d.ep;
  return dims;
}

DeviceMesh::DeviceMesh(Communicator& world, const MeshDims& dims) : world_(world), dims_(dims) {
  TITAN_CHECK(world.size() == dims.world(), "a mesh of ", dims.world(), " ranks over a world of ",
              world.size());
  tp_index_ = world.rank() % dims.tp;
  const int64_t dp_rank = world.rank() / dims.tp;
  replicate_index_ = dp_rank / dims.dp_shard;
  shard_index_ = dp_rank % dims.dp_shard;
  // A split's color names the group, its key the rank's place in it.
  const auto split = [&](int64_t color, int64_t key) {
    return world.split(static_cast<int>(color), static_cast<int>(key));
  };
  shard_group_ = split(replicate_index_ * dims.tp + tp_index_, shard_index_);
  replicate_group_ = split(shard_index_ * dims.tp + tp_index_, replicate_index_);
  tp_group_ = split(dp_rank, tp_index_);
  if (dims.tp > 1) dp_group_ = split(tp_index_, dp_rank);  // else the world itself
  if (dims.ep > 1) {
    // (shard index, tp index) flattened; each run of ep consecutive ones is an EP group.
    const int64_t inner = shard_index_ * dims.tp + tp_index_;
    const int64_t groups_per_replica = dims.dp_shard * dims.tp / dims.ep;
    const int64_t ep_group = replicate_index_ * groups_per_replica + inner / dims.ep;
    ep_index_ = inner % dims.ep;
    shares_model_with_rank0_ = ep_group == 0;
    ep_group_ = split(ep_group, ep_index_);
    same_experts_group_ = split(ep_index_, ep_group);
    if (dims.fsdp()) expert_shard_group_ = split(replicate_index_ * dims.ep + ep_index_, ep_group);
  } else {
    shares_model_with_rank0_ = dp_rank == 0;
  }
}

std::vector<std::pair<std::string, const Communicator*>> DeviceMesh::named_groups() const {
  std::vector<std::pair<std::string, const Communicator*>> groups = {
      {"dp", dp_group_ ? dp_group_.get() : &world_},
      {"dp_shard", shard_group_.get()},
      {"dp_replicate", replicate_group_.get()},
      {"tp", tp_group_.get()}};
  if (dp_group_) groups.emplace_back("world", &world_);
  if (ep_group_) {
    groups.emplace_back("ep", ep_group_.get());
    groups.emplace_back("same_experts", same_experts_group_.get());
  }
  if (expert_shard_group_) groups.emplace_back("expert_shard", expert_shard_group_.get());
  return groups;
}

std::string DeviceMesh::describe() const {
  return "rank " + std::to_string(world_.rank()) + " of " + std::to_string(world_.size()) +
         ": dp_replicate " + std::to_string(replicate_index_) + " of " +
         std::to_string(dims_.dp_replicate) + ", dp_shard " + std::to_string(shard_index_) +
         " of " + std::to_string(dims_.dp_shard) +
         (dims_.tp == 1 ? ""
                        : ", tp " + std::to_string(tp_index_) + " of " + std::to_string(dims_.tp)) +
         (dims_.ep == 1 ? ""
                        : ", ep " + std::to_string(ep_index_) + " of " + std::to_string(dims_.ep));
}

}  // namespace titan
