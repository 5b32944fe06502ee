// What a rank knows of the others while it waits for them: each rank's communication thread
// (distributed/comm_stream.h) posts a small heartbeat to every other rank once a second -- the
// number of collectives it has entered -- whether its compute thread is computing or waiting, and
// records theirs. A rank whose heartbeats stop for comm.heartbeat_timeout_seconds is stopped
// (SIGSTOP), frozen or cut off, however long a step legitimately takes; a rank still beating but
// behind in collectives is the one the others wait for when a collective times out. Both verdicts
// name the ranks. The bookkeeping only: the messages travel over MPI (mpi_communicator.cpp).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace titan {

// The beats heard from each rank of a world of `size`, written by the communication thread and
// read by the watchdog thread (every field atomic).
class PeerBeats {
 public:
  // Every peer counts as heard at `now_ns` (start-up), none behind.
  PeerBeats(int rank, int size, int64_t now_ns);
  int rank() const { return rank_; }
  int size() const { return size_; }

  // A heartbeat from `peer`: it had entered `entered` collectives.
  void heard(int peer, int64_t entered, int64_t now_ns);
  // The communication thread looked for heartbeats at `now_ns` (silence is measured up to the last
  // look, so a thread of ours that stalls does not blame the others).
  void looked(int64_t now_ns);
  // This rank enters a collective; returns how many it has entered, this one included.
  int64_t enter_collective();
  int64_t entered() const { return entered_[rank_]; }
  int64_t entered(int peer) const { return entered_[peer]; }

  // The peers silent for at least `timeout_ns` at the last look, in rank order; none when the last
  // look is older than `stale_ns` at `now_ns` (this rank's own thread is not looking).
  std::vector<int> silent(int64_t timeout_ns, int64_t now_ns, int64_t stale_ns) const;
  // Seconds since `peer` was last heard, at the last look.
  int64_t silent_seconds(int peer) const;
  // The peers whose last heartbeat had entered fewer collectives than this rank has: the ones a
  // collective of this rank waits for.
  std::vector<int> behind() const;

 private:
  int rank_, size_;
  std::atomic<int64_t> looked_ns_;
  std::unique_ptr<std::atomic<int64_t>[]> heard_ns_, entered_;
};

// "rank 1", "ranks 1 and 2", "ranks 0, 2 and 3".
std::string rank_list(const std::vector<int>& ranks);

}  // namespace titan
