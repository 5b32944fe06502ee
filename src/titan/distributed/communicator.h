// The collectives data parallelism is built on, over one group of ranks (a communicator): what
// FSDP's all-gather and reduce-scatter, HSDP's all-reduce across replicas and the trainer's
// loss / token sums and the metrics' memory peaks (the maximum over ranks) need, and the
// all-to-all-v expert parallel exchanges rows with (nn/expert_parallel.h). One implementation
// over MPI (mpi_communicator.cpp) and one for a group of a single rank (`titan train` without
// mpirun); a CUDA backend will add one over NCCL. Every rank of a group makes the same calls in the
// same order with the same counts.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/distributed/comm_counts.h"
#include "titan/distributed/comm_stream.h"

namespace titan {

// One tensor's part in an all-gather or a reduce-scatter: its elements cut between the ranks in
// rank order, rank r's the counts[r] after those of the ranks before it (FSDP: a parameter's dim-0
// rows, nn/shard.h). Every rank passes the same counts.
struct CommPart {
  void* whole = nullptr;  // the sum of counts elements
  void* own = nullptr;    // this rank's counts[rank()] elements
  std::vector<int64_t> counts;
  DType dtype = DType::f32;  // f32, or bf16 in an all-gather
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // data (count) = the sum over ranks of each rank's data (count), in place.
  virtual void all_reduce_sum(float* data, int64_t count) = 0;
  virtual void all_reduce_sum(double* data, int64_t count) = 0;
  // data (count) = the maximum over ranks of each rank's data (count), in place.
  virtual void all_reduce_max(double* data, int64_t count) = 0;
  // Queued on the process's communication stream (distributed/comm_stream.h) as one collective,
  // each part straight into its place (no staging): what a part's collective reads must stay
  // unchanged, and what it writes unread, until the handle is waited for. A group of one rank
  // copies at once. For every part, whole = every rank's own, in rank order.
  virtual CommHandle all_gather_async(std::vector<CommPart> parts) = 0;
  // For every part, root's whole = every rank's own, in rank order; the other ranks' whole is
  // neither read nor written (may be null). Queued like all_gather_async. The export gathers a
  // unit this way so that only the rank writing it holds it whole.
  virtual CommHandle gather_async(std::vector<CommPart> parts, int root) = 0;
  // For every part (f32), own = the sum over ranks of their whole's elements at this rank's place.
  virtual CommHandle reduce_scatter_sum_async(std::vector<CommPart> parts) = 0;
  // All-to-all-v (expert parallel's exchange of rows, nn/layers.h SparseMoeBlock): this rank
  // sends send_counts[p] elements of `dtype` (f32, bf16 or i32) to rank p, taken from `send` after
  // those for the ranks before p, and receives recv_counts[p] elements from rank p into `recv`,
  // placed likewise in rank order. recv_counts[p] must be the send_counts[rank()] that rank p
  // passes (all_to_all_counts tells each rank); any count may be 0. Queued as the collectives
  // above: `send` unchanged and `recv` unread until the handle is waited for; the two must not
  // overlap. A group of one rank copies at once.
  virtual CommHandle all_to_all_v_async(const void* send, const std::vector<int64_t>& send_counts,
                                        void* recv, const std::vector<int64_t>& recv_counts,
                                        DType dtype) = 0;
  // The counts exchange before an all-to-all-v: returns recv_counts, recv_counts[p] = the
  // send_counts[rank()] that rank p passes (each rank tells each peer how many rows, or elements,
  // it will send). send_counts has size() entries. Blocking.
  virtual std::vector<int64_t> all_to_all_counts(const std::vector<int64_t>& send_counts) = 0;
  // data (count) = root's data.
  virtual void broadcast(float* data, int64_t count, int root) = 0;
  virtual void barrier() = 0;
  // The group of the ranks passing the same color, ordered by key (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;

  // What this group's collectives moved since it was made (distributed/comm_counts.h), counted
  // as each call is made, on the thread that makes it.
  const CommCounts& counts() const { return counts_; }

 protected:
  // One call of `kind` with `bytes` (comm_counts.h's measure); nothing in a group of one rank.
  void count(Collective kind, int64_t bytes) {
    if (size() > 1) counts_.add(kind, bytes);
  }
  // The whole side of an all-gather's, a gather's or a reduce-scatter's parts, in bytes.
  static int64_t whole_bytes(const std::vector<CommPart>& parts);

 private:
  CommCounts counts_;
};

// The group of one rank: every collective is a copy or nothing.
std::unique_ptr<Communicator> make_single_rank_communicator();

}  // namespace titan
