// A communication stream: one worker thread that runs the collectives queued to it one at a time,
// in the order they were submitted, while the thread that queued them computes. The compute thread
// waits on a collective's handle only where it needs the result, so a reduce-scatter of one unit's
// gradients runs under the next unit's backward and the all-gather of the next unit under this
// one's compute (distributed/fsdp.h). Every rank queues the same collectives in the same order, so
// they meet in the same order on every rank. Under MPI (mpi_communicator.cpp) every MPI call after
// start-up runs on this one thread, blocking collectives too (queued, then waited for at once);
// a CUDA backend maps it onto a CUDA stream running NCCL, the handle onto an event.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace titan {

class CommStream;

// Seconds the stream's thread spent running collectives, and how much of it the compute thread
// spent waiting on handles (the rest ran while it computed).
struct CommTimes {
  double busy_s = 0.0;
  double exposed_s = 0.0;
  double hidden_fraction() const { return busy_s > 0.0 ? 1.0 - exposed_s / busy_s : 0.0; }
};

// One queued collective. A default-made handle is complete (a collective that ran at once, as on a
// group of one rank). A handle dropped unwaited leaves its collective to run: its buffers must
// outlive it.
class CommHandle {
 public:
  CommHandle() = default;
  // Returns once the collective has run (its output is written); rethrows its error. Waiting
  // again is a no-op. Time spent here, the collective not yet done, counts as exposed.
  void wait();
  bool pending() const { return task_ != nullptr; }

 private:
  friend class CommStream;
  struct Task;
  explicit CommHandle(std::shared_ptr<Task> task) : task_(std::move(task)) {}
  std::shared_ptr<Task> task_;
};

class CommStream {
 public:
  // `idle`, when given, runs on the stream's thread every `idle_period_ns` while nothing is queued
  // (MPI's heartbeats, distributed/heartbeat.h: the thread that calls MPI keeps beating while the
  // compute thread computes).
  explicit CommStream(std::function<void()> idle = {}, int64_t idle_period_ns = 0);
  // Runs what is queued, then stops the thread.
  ~CommStream();
  CommStream(const CommStream&) = delete;
  CommStream& operator=(const CommStream&) = delete;

  // Queues `work` (run on the stream's thread after everything queued before it). An exception
  // it throws is kept and rethrown by the handle's wait().
  CommHandle submit(std::function<void()> work);
  // submit(work).wait().
  void run(std::function<void()> work);
  CommTimes times() const;
  void reset_times();

 private:
  friend class CommHandle;
  void work_loop();
  void wait(CommHandle::Task& task);

  const std::function<void()> idle_;
  const int64_t idle_period_ns_;
  mutable std::mutex mutex_;
  std::condition_variable queued_, finished_;
  std::deque<std::shared_ptr<CommHandle::Task>> queue_;
  bool stopping_ = false;
  int64_t busy_ns_ = 0, exposed_ns_ = 0;
  std::thread thread_;  // last: starts once the rest is built
};

}  // namespace titan
