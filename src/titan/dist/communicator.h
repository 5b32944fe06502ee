// The collectives data parallelism is built on, over one group of ranks (a communicator): what
// FSDP's all-gather and reduce-scatter, HSDP's all-reduce across replicas and the trainer's
// loss / token sums and the metrics' memory peaks (the maximum over ranks) need. One implementation
// over MPI (mpi_communicator.cpp) and one for a group of a single rank (`titan train` without
// mpirun); a CUDA backend will add one over NCCL. Every rank of a group makes the same calls in the
// same order with the same counts.
#pragma once

#include <cstdint>
#include <memory>

#include "titan/dist/comm_stream.h"

namespace titan {

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
  // out (size x count) = every rank's in (count), in rank order.
  virtual void all_gather(float* out, const float* in, int64_t count) = 0;
  // out (count) = the sum over ranks of their in's block `rank()` (in: size x count).
  virtual void reduce_scatter_sum(float* out, const float* in, int64_t count) = 0;
  // The same, queued on the process's communication stream (dist/comm_stream.h): `in` must stay
  // unchanged and `out` unread until the handle is waited for. A group of one rank copies at once.
  virtual CommHandle all_gather_async(float* out, const float* in, int64_t count) = 0;
  virtual CommHandle reduce_scatter_sum_async(float* out, const float* in, int64_t count) = 0;
  // data (count) = root's data.
  virtual void broadcast(float* data, int64_t count, int root) = 0;
  virtual void barrier() = 0;
  // The group of the ranks passing the same color, ordered by key (MPI_Comm_split).
  virtual std::unique_ptr<Communicator> split(int color, int key) = 0;
};

// The group of one rank: every collective is a copy or nothing.
std::unique_ptr<Communicator> make_single_rank_communicator();

}  // namespace titan
