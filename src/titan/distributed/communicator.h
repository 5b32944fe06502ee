// The collectives data parallelism is built on, over one group of ranks (a communicator): what
// FSDP's all-gather and reduce-scatter, HSDP's all-reduce across replicas and the trainer's
// loss / token sums and the metrics' memory peaks (the maximum over ranks) need. One implementation
// over MPI (mpi_communicator.cpp) and one for a group of a single rank (`titan train` without
// mpirun); a CUDA backend will add one over NCCL. Every rank of a group makes the same calls in the
// same order with the same counts.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/distributed/comm_stream.h"

namespace titan {

// One tensor's part in an all-gather or a reduce-scatter: its elements cut between the ranks in
// rank order, rank r's the counts[r] after those of the ranks before it (FSDP: a parameter's dim-0
// rows, nn/row_shard.h). Every rank passes the same counts.
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
  // For every part (f32), own = the sum over ranks of their whole's elements at this rank's place.
  virtual CommHandle reduce_scatter_sum_async(std::vector<CommPart> parts) = 0;
  // data (count) = root's data.
  virtual void broadcast(float* data, int64_t count, int root) = 0;
  virtual void barrier() = 0;
  // The group of the ranks passing the same color, ordered by key (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
};

// The group of one rank: every collective is a copy or nothing.
std::unique_ptr<Communicator> make_single_rank_communicator();

}  // namespace titan
