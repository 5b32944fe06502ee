// FSDP's bookkeeping on a shard group of one rank (the collectives are copies there; several ranks
// are tests/e2e/train_data_parallel.sh): whole units are resident only in flight, initialisation
// keeps each rank's rows, and a unit kept after its forward (fsdp_reshard_after_forward) is not
// gathered again for its backward; under bf16 the weights read only in bf16 are gathered into
// their copies, rounded, their masters never committed. Shard's cut is checked against the rows
// it must hold, and the reshard policy's rule (keeps_whole, which the plan shares) for every end;
// the collectives move every parameter in place, nothing staged.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "titan/core/allocator.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/distributed/communicator.h"
#include "titan/distributed/fsdp.h"
#include "titan/distributed/mesh.h"
#include "titan/nn/param_group.h"
#include "titan/nn/shard.h"

namespace titan {
namespace {

TEST(Shard, EveryRowOnceInEqualBlocks) {
  for (int64_t d0 : {1, 2, 3, 7, 8, 1000}) {
    for (int64_t count : {1, 2, 3, 4, 64}) {
      int64_t next = 0;
      for (int64_t i = 0; i < count; ++i) {
        const Shard s{i, count};
        EXPECT_EQ(s.per_shard(d0), (d0 + count - 1) / count);
        EXPECT_EQ(s.first(d0), next) << d0 << " rows, shard " << i << " of " << count;
        EXPECT_GE(s.size(d0), 0);
        EXPECT_LE(s.size(d0), s.per_shard(d0));
        next += s.size(d0);
      }
      EXPECT_EQ(next, d0) << d0 << " rows over " << count;
    }
  }
  const ParamSpec cut = Shard{1, 3}.spec_of({"w", {7, 5}, ParamInit::normal});
  EXPECT_EQ(cut.shape, (Shape{3, 5}));
  EXPECT_EQ(cut.name, "w");
}

TEST(ReshardPolicy, KeepsWholeOnlyAfterTheForwardUsesItNames) {
  EXPECT_EQ(parse_reshard_policy("default"), ReshardPolicy::except_next);
  EXPECT_EQ(parse_reshard_policy("always"), ReshardPolicy::always);
  EXPECT_EQ(parse_reshard_policy("never"), ReshardPolicy::never);
  try {
    parse_reshard_policy("sometimes");
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_STREQ(e.what(),
                 "parallelism.fsdp_reshard_after_forward 'sometimes' is not one of default, "
                 "always, never");
  }
  // Per policy, whether a use ending used_next, used_later, last or gradients keeps the unit.
  const std::vector<std::pair<ReshardPolicy, std::array<bool, 4>>> policies = {
      {ReshardPolicy::except_next, {true, false, false, false}},
      {ReshardPolicy::always, {false, false, false, false}},
      {ReshardPolicy::never, {true, true, false, false}}};
  const GroupUseEnd ends[] = {GroupUseEnd::used_next, GroupUseEnd::used_later, GroupUseEnd::last,
                              GroupUseEnd::gradients};
  for (const auto& [policy, keeps] : policies) {
    for (size_t e = 0; e < 4; ++e) {
      EXPECT_EQ(keeps_whole(policy, ends[e]), keeps[e])
          << static_cast<int>(policy) << ", end " << e;
    }
  }
}

std::vector<ParamGroup> released_groups() {
  std::vector<ParamGroup> groups;
  groups.emplace_back("embed", std::vector<ParamSpec>{{"e", {5, 3}, ParamInit::normal}},
                      Residency::released);
  groups.emplace_back(
      "block",
      std::vector<ParamSpec>{{"w", {4, 2}, ParamInit::normal}, {"n", {2}, ParamInit::ones}},
      Residency::released);
  for (ParamGroup& g : groups) g.allocate_gradients();
  return groups;
}

// One released group of `specs` (with gradients), and values between bf16 neighbours for its
// parameters, half of them exactly halfway (ties to even): bf16_value(i) at element i of each.
std::vector<ParamGroup> one_released_group(const std::string& name,
                                           const std::vector<ParamSpec>& specs) {
  std::vector<ParamGroup> full;
  full.emplace_back(name, specs, Residency::released);
  full[0].allocate_gradients();
  return full;
}

float bf16_value(int64_t i) {
  return 1.0f + static_cast<float>(i) * 0x1p-9f;
}

void initialize_bf16_values(FullyShardedGroups& fsdp) {
  fsdp.initialize([](ParamGroup& g) {
    for (const ParamView& v : g.views()) {
      for (int64_t i = 0; i < v.numel; ++i) g.params()[v.offset + i] = bf16_value(i);
    }
  });
}

size_t parameter_bytes() {
  return memory_stats().current[static_cast<int>(MemCategory::parameters)];
}

TEST(Fsdp, UnitsAreResidentOnlyInFlightAndKeptOnesSkipTheGather) {
  std::unique_ptr<Communicator> world = make_single_rank_communicator();
  DeviceMesh mesh(*world, resolve_mesh_dims({1, 1}, 1));
  std::vector<ParamGroup> full = released_groups();
  FullyShardedGroups fsdp(full, mesh);
  fsdp.initialize([](ParamGroup& g) {
    for (const ParamView& v : g.views()) {
      for (int64_t i = 0; i < v.numel; ++i) g.params()[v.offset + i] = static_cast<float>(i + 1);
    }
  });
  for (const ParamGroup& g : full) EXPECT_FALSE(g.params_resident()) << g.name();
  const ParamGroup& shard = fsdp.shards()[1];
  EXPECT_EQ(shard.params()[shard.view("w").offset + 7], 8.0f);

  // Which forward ends keep a unit whole, per policy: used again next, used again later, not
  // used again (evaluation).
  const std::vector<std::pair<std::string, std::array<bool, 3>>> policies = {
      {"default", {true, false, false}},
      {"always", {false, false, false}},
      {"never", {true, true, false}}};
  for (const auto& [policy, keeps] : policies) {
    fsdp.set_reshard_after_forward(policy);
    const GroupUseEnd ends[] = {GroupUseEnd::used_next, GroupUseEnd::used_later, GroupUseEnd::last};
    for (size_t e = 0; e < 3; ++e) {
      fsdp.acquire(1, false);
      fsdp.release(1, ends[e]);
      EXPECT_EQ(full[1].params_resident(), keeps[e]) << policy << ", end " << e;
      fsdp.release_all();
    }
  }

  fsdp.set_reshard_after_forward("default");
  fsdp.acquire(0, false);
  fsdp.acquire(1, false);
  EXPECT_EQ(full[1].params()[full[1].view("w").offset + 3], 4.0f);
  fsdp.release(0, GroupUseEnd::used_later);
  fsdp.release(1, GroupUseEnd::used_next);
  EXPECT_FALSE(full[0].params_resident());
  ASSERT_TRUE(full[1].params_resident());
  // Proof that the backward's acquire does not gather again: a value written into the kept
  // whole parameters survives it.
  full[1].params()[full[1].view("w").offset] = -1.0f;
  fsdp.zero_gradients();
  fsdp.acquire(1, true);
  EXPECT_EQ(full[1].params()[full[1].view("w").offset], -1.0f);
  full[1].grads()[full[1].view("n").offset + 1] = 0.5f;
  fsdp.release(1, GroupUseEnd::gradients);
  EXPECT_FALSE(full[1].params_resident());
  fsdp.finish_gradients();  // the reduce-scatter is summed in when the step's gradients are done
  EXPECT_EQ(shard.grads()[shard.view("n").offset + 1], 0.5f);
  // Released, the next use gathers the shard again.
  fsdp.acquire(1, false);
  EXPECT_EQ(full[1].params()[full[1].view("w").offset], 1.0f);
  fsdp.release_all();
  EXPECT_FALSE(full[1].params_resident());
}

TEST(Fsdp, Bf16GatherFillsTheCopiesAndCommitsOnlyTheFp32Masters) {
  std::unique_ptr<Communicator> world = make_single_rank_communicator();
  DeviceMesh mesh(*world, resolve_mesh_dims({1, 1}, 1));
  // A norm read in fp32, then a weight read only through its bf16 copy (laid out last).
  std::vector<ParamGroup> full =
      one_released_group("block", {{"n", {3}, ParamInit::ones}, {"w", {5, 7}, ParamInit::normal}});
  FullyShardedGroups fsdp(full, mesh);
  initialize_bf16_values(fsdp);
  const auto value = bf16_value;
  std::vector<uint16_t> copy(35, 0);
  fsdp.gather_in_bf16({{{"w", copy.data()}}}, {{{"w", copy.data()}}});
  fsdp.set_reshard_after_forward("never");

  const auto params_bytes = parameter_bytes;
  const size_t before = params_bytes();
  fsdp.acquire(0, false);
  // Only "n" (one 16-float span) is charged: the master of "w" is never needed.
  EXPECT_EQ(params_bytes() - before, 16 * sizeof(float));
  const ParamGroup& g = full[0];
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(g.params()[g.view("n").offset + i], value(i));
  for (int64_t i = 0; i < 35; ++i) EXPECT_EQ(copy[i], f32_to_bf16(value(i))) << i;
  fsdp.release(0, GroupUseEnd::used_later);  // kept: resident, copy untouched
  EXPECT_TRUE(g.params_resident());
  fsdp.release_all();
  EXPECT_EQ(params_bytes(), before);
  // The export's gather to rank 0 writes the masters it is asked for in fp32, and commits only
  // those.
  fsdp.gather_to_root(0, {"w"});
  for (int64_t i = 0; i < 35; ++i) EXPECT_EQ(g.params()[g.view("w").offset + i], value(i));
  EXPECT_EQ(params_bytes() - before, static_cast<size_t>(g.numel() - 16) * sizeof(float));
  fsdp.gather_to_root(0, {"n", "w"});
  EXPECT_EQ(params_bytes() - before, static_cast<size_t>(g.numel()) * sizeof(float));
  EXPECT_THROW(fsdp.gather_to_root(0, {"nope"}), Error);
  fsdp.release_all();
  EXPECT_EQ(params_bytes(), before);
}

// A frozen base held in bf16 (LoRA's lora.base_dtype): the shard of a weight read only in bf16 is
// bf16 rows (its fp32 rows never committed), loaded, not initialised; the gather sends them as
// they are into the copy; a use gathering it in fp32, and the export's fp32 gather before
// widen_bf16_shards, are refused; widened, the shard's fp32 rows are its bf16 values exactly.
TEST(Fsdp, Bf16ShardsAreSentAsTheyAreAndWidenedForTheExport) {
  std::unique_ptr<Communicator> world = make_single_rank_communicator();
  DeviceMesh mesh(*world, resolve_mesh_dims({1, 1}, 1));
  std::vector<ParamGroup> full;
  full.emplace_back(
      "block",
      std::vector<ParamSpec>{{"n", {3}, ParamInit::ones}, {"w", {5, 7}, ParamInit::normal}},
      Residency::released);
  full[0].freeze();
  const size_t before = parameter_bytes();
  FullyShardedGroups fsdp(full, mesh, {{"w"}});
  // The norm's fp32 span (16 floats) and the weight's 35 bf16 rows.
  EXPECT_EQ(parameter_bytes() - before, 16 * sizeof(float) + 35 * sizeof(uint16_t));
  EXPECT_THROW(initialize_bf16_values(fsdp), Error);
  ParamGroup& shard = fsdp.shards()[0];
  ASSERT_EQ(shard.compute_copy_numel(), 35);
  uint16_t* rows = shard.compute_copy() + shard.view("w").copy_offset;
  for (int64_t i = 0; i < 35; ++i) rows[i] = f32_to_bf16(bf16_value(i));
  for (int64_t i = 0; i < 3; ++i) shard.params()[shard.view("n").offset + i] = bf16_value(i);

  std::vector<uint16_t> copy(35, 0);
  fsdp.gather_in_bf16({{{"w", copy.data()}}}, {{{"w", copy.data()}}});
  const size_t held = parameter_bytes();
  fsdp.acquire(0, false);
  EXPECT_EQ(parameter_bytes() - held, 16 * sizeof(float));  // only the norm's master in flight
  for (int64_t i = 0; i < 35; ++i) EXPECT_EQ(copy[i], rows[i]) << i;
  const ParamGroup& g = full[0];
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(g.params()[g.view("n").offset + i], bf16_value(i));
  fsdp.release_all();
  fsdp.gather_in_bf16({{}}, {{}});  // a use reading "w" in fp32: it has no fp32 rows
  EXPECT_THROW(fsdp.acquire(0, false), Error);
  fsdp.release_all();
  EXPECT_THROW(fsdp.gather_to_root(0, {"w"}), Error);
  fsdp.release_all();

  fsdp.widen_bf16_shards();  // the weight's whole fp32 span (48 floats) committed beside its rows
  EXPECT_EQ(parameter_bytes() - held, 48 * sizeof(float));
  fsdp.gather_to_root(0, {"n", "w"});
  for (int64_t i = 0; i < 35; ++i) {
    EXPECT_EQ(g.params()[g.view("w").offset + i], round_to_bf16(bf16_value(i))) << i;
  }
  for (int64_t i = 0; i < 3; ++i) EXPECT_EQ(g.params()[g.view("n").offset + i], bf16_value(i));
  fsdp.release_all();
}

// A tied embedding's unit under bf16: the embedding's forward reads its fp32 master (the lookup),
// the loss reads it only through the lm_head's copy (through_copies: gathered in bf16 into the
// copy, only the norm's master committed), the embedding's backward reads nothing (no gather, only
// the gradients). A prefetch must name the use it gathers for.
TEST(Fsdp, EachUseGathersWhatItReads) {
  std::unique_ptr<Communicator> world = make_single_rank_communicator();
  DeviceMesh mesh(*world, resolve_mesh_dims({1, 1}, 1));
  std::vector<ParamGroup> full =
      one_released_group("embed", {{"e", {6, 4}, ParamInit::normal}, {"n", {4}, ParamInit::ones}});
  FullyShardedGroups fsdp(full, mesh);
  initialize_bf16_values(fsdp);
  const auto value = bf16_value;
  std::vector<uint16_t> copy(24, 0);
  fsdp.gather_in_bf16({{}}, {{{"e", copy.data()}}});
  const auto params_bytes = parameter_bytes;
  const size_t before = params_bytes();
  const ParamGroup& g = full[0];

  fsdp.acquire(0, false, GroupReads::parameters);  // every master, no copy
  EXPECT_EQ(params_bytes() - before, static_cast<size_t>(g.numel()) * sizeof(float));
  EXPECT_EQ(g.params()[g.view("e").offset + 23], value(23));
  for (uint16_t c : copy) EXPECT_EQ(c, 0);
  fsdp.release(0, GroupUseEnd::used_later);
  EXPECT_FALSE(g.params_resident());

  fsdp.prefetch(0, GroupReads::through_copies);
  fsdp.acquire(0, true, GroupReads::through_copies);  // the copy, and only the norm's master
  EXPECT_EQ(params_bytes() - before, 16 * sizeof(float));
  for (int64_t i = 0; i < 24; ++i) EXPECT_EQ(copy[i], f32_to_bf16(value(i))) << i;
  for (int64_t i = 0; i < 4; ++i) EXPECT_EQ(g.params()[g.view("n").offset + i], value(i));
  fsdp.release(0, GroupUseEnd::gradients);
  EXPECT_EQ(params_bytes(), before);

  fsdp.prefetch(0, GroupReads::nothing);  // nothing in flight after it
  fsdp.acquire(0, true, GroupReads::nothing);
  EXPECT_FALSE(g.params_resident());
  EXPECT_EQ(params_bytes(), before);
  g.grads()[g.view("n").offset] = 0.25f;
  fsdp.release(0, GroupUseEnd::gradients);
  fsdp.finish_gradients();
  EXPECT_EQ(fsdp.shards()[0].grads()[fsdp.shards()[0].view("n").offset], 0.25f);

  fsdp.prefetch(0, GroupReads::parameters);
  EXPECT_THROW(fsdp.acquire(0, false, GroupReads::through_copies), Error);
  fsdp.release_all();
}

// Every parameter goes straight between its shard and its place in the whole group, so the only
// buffers of FSDP's own are one reduced shard (and, under bf16, the rows rounded to send): no
// staging of N x the largest shard. A prefetch commits the destination its gather writes; a
// unit's whole gradients stay until their reduce-scatter is summed in (at the next release with
// gradients, an acquire of the same unit's gradients, or finish_gradients).
TEST(Fsdp, GathersAndScattersInPlace) {
  std::unique_ptr<Communicator> world = make_single_rank_communicator();
  DeviceMesh mesh(*world, resolve_mesh_dims({1, 1}, 1));
  const auto bytes = [](MemCategory c) { return memory_stats().current[static_cast<int>(c)]; };
  const size_t other_before = bytes(MemCategory::other);
  std::vector<ParamGroup> full = released_groups();
  FullyShardedGroups fsdp(full, mesh);
  const int64_t largest_shard = std::max(full[0].numel(), full[1].numel());  // one rank: whole
  EXPECT_EQ(bytes(MemCategory::other) - other_before,
            static_cast<size_t>(largest_shard) * sizeof(float));
  initialize_bf16_values(fsdp);

  const size_t params_before = parameter_bytes();
  fsdp.prefetch(1);
  EXPECT_TRUE(full[1].params_resident());
  EXPECT_EQ(parameter_bytes() - params_before,
            static_cast<size_t>(full[1].numel()) * sizeof(float));
  fsdp.acquire(1, true);
  EXPECT_EQ(full[1].params()[full[1].view("w").offset + 7], bf16_value(7));

  const auto grad_bytes = [&] { return bytes(MemCategory::gradients); };
  const size_t grads_before = grad_bytes() - static_cast<size_t>(full[1].numel()) * sizeof(float);
  const ParamGroup& shard = fsdp.shards()[1];
  const auto shard_grad = [&](int64_t i) { return shard.grads()[shard.view("w").offset + i]; };
  fsdp.zero_gradients();
  full[1].grads()[full[1].view("w").offset + 3] = 0.5f;
  fsdp.release(1, GroupUseEnd::gradients);
  EXPECT_FALSE(full[1].params_resident());
  EXPECT_EQ(grad_bytes() - grads_before, static_cast<size_t>(full[1].numel()) * sizeof(float));
  EXPECT_EQ(shard_grad(3), 0.0f);  // not summed in yet
  // The same unit's gradients again: the pending ones are summed in first, the new ones start at 0.
  fsdp.acquire(1, true);
  EXPECT_EQ(shard_grad(3), 0.5f);
  EXPECT_EQ(full[1].grads()[full[1].view("w").offset + 3], 0.0f);
  full[1].grads()[full[1].view("w").offset + 3] = 0.25f;
  fsdp.release(1, GroupUseEnd::gradients);
  // Another unit's release with gradients sums in the one before.
  fsdp.acquire(0, true);
  fsdp.release(0, GroupUseEnd::gradients);
  EXPECT_EQ(shard_grad(3), 0.75f);
  EXPECT_EQ(grad_bytes() - grads_before, static_cast<size_t>(full[0].numel()) * sizeof(float));
  fsdp.finish_gradients();
  EXPECT_EQ(grad_bytes(), grads_before);
  fsdp.release_all();
  EXPECT_EQ(parameter_bytes(), params_before);
}

}  // namespace
}  // namespace titan
