// The data-parallel mesh: how [parallelism] degrees resolve against a world, what each bad
// combination is told, and the collectives of a group of one rank. The collectives over MPI are
// exercised by tests/e2e/train_data_parallel.sh (several ranks, against one process).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "error_of.h"
#include "titan/core/error.h"
#include "titan/distributed/communicator.h"
#include "titan/distributed/mesh.h"

namespace titan {
namespace {

std::string error_of(const ParallelDegrees& d, int64_t world) {
  return test::error_of([&] { resolve_mesh_dims(d, world); });
}

TEST(Mesh, ResolvesTheRestOfTheWorld) {
  MeshDims m = resolve_mesh_dims({1, -1}, 8);
  EXPECT_EQ(m.dp_replicate, 1);
  EXPECT_EQ(m.dp_shard, 8);
  m = resolve_mesh_dims({2, -1}, 8);
  EXPECT_EQ(m.dp_replicate, 2);
  EXPECT_EQ(m.dp_shard, 4);
  m = resolve_mesh_dims({4, 1}, 4);
  EXPECT_EQ(m.dp(), 4);
  m = resolve_mesh_dims({1, -1}, 1);
  EXPECT_EQ(m.dp(), 1);
  m = resolve_mesh_dims({2, -1, 2, 1, 1, 1}, 8);  // TP innermost: the rest is the shard degree
  EXPECT_EQ(m.dp_shard, 2);
  EXPECT_EQ(m.tp, 2);
  EXPECT_EQ(m.world(), 8);
  EXPECT_EQ(m.ep, 1);
  m = resolve_mesh_dims({1, -1, 1, 1, 1, 4}, 4);  // EP borrows dp_shard's ranks
  EXPECT_EQ(m.dp_shard, 4);
  EXPECT_EQ(m.ep, 4);
  EXPECT_EQ(m.world(), 4);
  EXPECT_FALSE(m.fsdp());  // EP over the whole shard axis: the experts whole, the rest replicated
  EXPECT_TRUE(resolve_mesh_dims({1, -1, 1, 1, 1, 2}, 4).fsdp());  // FSDP 2 x EP 2
  m = resolve_mesh_dims({2, -1, 2, 1, 1, 2}, 8);                  // or dp_shard x tp's
  EXPECT_EQ(m.dp_shard, 2);
  EXPECT_EQ(m.ep, 2);
  EXPECT_TRUE(resolve_mesh_dims({1, -1}, 2).fsdp());
  // EP borrowing dp_shard x tp: FSDP while some of it is left for the experts.
  EXPECT_TRUE(resolve_mesh_dims({1, -1, 2, 1, 1, 2}, 4).fsdp());   // FSDP 2 x TP 2 x EP 2
  EXPECT_FALSE(resolve_mesh_dims({1, -1, 2, 1, 1, 4}, 4).fsdp());  // TP 2 x EP 4
  EXPECT_FALSE(resolve_mesh_dims({1, -1, 2, 1, 1, 2}, 2).fsdp());  // TP 2 x EP 2
}

TEST(Mesh, EachBadCombinationNamesItsKey) {
  EXPECT_NE(error_of({3, -1}, 8)
                .find("data_parallel_replicate_degree = 3 does not divide the "
                      "world of 8 ranks"),
            std::string::npos);
  EXPECT_NE(error_of({2, 2}, 8).find("= 4 ranks, but the world has 8"), std::string::npos);
  EXPECT_NE(error_of({2, 1}, 1).find("run under mpirun"), std::string::npos);
  EXPECT_NE(error_of({0, 1}, 1).find("data_parallel_replicate_degree = 0"), std::string::npos);
  EXPECT_NE(error_of({1, 0}, 1).find("data_parallel_shard_degree = 0"), std::string::npos);
  EXPECT_NE(error_of({1, -1, 3, 1, 1, 1}, 8).find("tensor_parallel_degree = 3 does not divide"),
            std::string::npos);
  EXPECT_NE(error_of({1, 2, 2, 1, 1, 1}, 8).find("x tensor_parallel_degree 2 = 4 ranks"),
            std::string::npos);
  EXPECT_NE(error_of({1, -1, 1, 1, 1, 3}, 4)
                .find("expert_parallel_degree = 3 does not divide data_parallel_shard_degree 4 "
                      "(expert parallel borrows its ranks from it)"),
            std::string::npos);
  EXPECT_NE(error_of({2, -1, 1, 1, 1, 4}, 4).find("does not divide data_parallel_shard_degree 2"),
            std::string::npos);
  EXPECT_NE(error_of({1, -1, 1, 1, 1, 0}, 4).find("expert_parallel_degree = 0: must be at least 1"),
            std::string::npos);
  EXPECT_NE(error_of({1, 1, 2, 1, 1, 4}, 2)
                .find("data_parallel_shard_degree 1 x tensor_parallel_degree 2 = 2 (expert"),
            std::string::npos);
  EXPECT_NE(error_of({1, -1, 1, 2, 1, 1}, 4).find("pipeline_parallel_degree = 2"),
            std::string::npos);
}

TEST(Mesh, SingleRankGroupCopies) {
  auto comm = make_single_rank_communicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  std::vector<float> in = {1, 2, 3}, out(3, 0.0f);
  comm->all_gather_async({{out.data(), in.data(), {3}, DType::f32}}).wait();
  EXPECT_EQ(out, in);
  std::fill(out.begin(), out.end(), 0.0f);
  comm->reduce_scatter_sum_async({{in.data(), out.data(), {3}, DType::f32}}).wait();
  EXPECT_EQ(out, in);
  std::vector<uint16_t> bits = {0x3f80, 0x4000};
  std::vector<uint16_t> gathered(2, 0);
  comm->all_gather_async({{gathered.data(), bits.data(), {2}, DType::bf16}}).wait();
  EXPECT_EQ(gathered, bits);
  EXPECT_THROW(comm->all_gather_async({{out.data(), in.data(), {1, 2}, DType::f32}}), Error);
  double sums[2] = {1.5, 2.5};
  comm->all_reduce_sum(sums, 2);
  EXPECT_EQ(sums[0], 1.5);
  DeviceMesh mesh(*comm, resolve_mesh_dims({1, -1}, 1));
  EXPECT_EQ(mesh.describe(), "rank 0 of 1: dp_replicate 0 of 1, dp_shard 0 of 1");
  EXPECT_EQ(mesh.shard_group().size(), 1);
}

}  // namespace
}  // namespace titan
