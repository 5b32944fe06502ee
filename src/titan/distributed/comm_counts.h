// What a group's collectives moved: per kind of collective, the calls and their bytes, counted by
// the Communicator as each is made (always on: two additions a call). A call's bytes are its
// buffer on the calling rank, whatever algorithm MPI runs it with: an all-reduce's or a
// broadcast's data; an all-gather's, a gather's or a reduce-scatter's whole side (every rank's
// part); an all-to-all-v's rows sent to the other ranks (its own stay), and the counts exchange
// before it, 8 bytes per peer. A group of one rank moves nothing and counts nothing.
// `titan plan` predicts the same figures per step (train/training_plan.h CommRow) and the trainer
// reports them measured (train/trainer.cpp).
#pragma once

#include <array>
#include <cstdint>

namespace titan {

enum class Collective : int {
  all_reduce,
  all_gather,
  reduce_scatter,
  gather,
  all_to_all_v,
  all_to_all_counts,
  broadcast,
  barrier,
};
inline constexpr int kCollectiveKinds = 8;

// "all_reduce", "all_gather", ...: as MPI's calls are named, without the prefix.
const char* collective_name(Collective kind);

struct CollectiveCount {
  int64_t calls = 0, bytes = 0;
};

struct CommCounts {
  std::array<CollectiveCount, kCollectiveKinds> of{};

  void add(Collective kind, int64_t bytes) {
    CollectiveCount& c = of[static_cast<int>(kind)];
    ++c.calls;
    c.bytes += bytes;
  }
  const CollectiveCount& operator[](Collective kind) const { return of[static_cast<int>(kind)]; }
  // What was counted since `earlier` (a snapshot of the same counts).
  CommCounts since(const CommCounts& earlier) const;
  CommCounts& operator+=(const CommCounts& more);
  bool empty() const;
};

}  // namespace titan
