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

// Seconds the stream's thread spent running collectives (busy), and the compute thread's waits on
// handles split in two: exposed, the part of a wait during which the stream's thread was running
// collectives (the awaited one or those queued before it), so a part of busy (the rest of busy
// ran while the compute thread computed); and hand-off, the rest of the waits, during which no
// collective ran -- the stream's thread waking up to a queued one, finishing an idle heartbeat,
// or the compute thread waking up to a finished one. A collective submitted and waited for at
// once (an all-to-all-v, a TP all-reduce) adds its whole run to exposed and two thread wake-ups
// to hand-off. With one thread waiting at a time (the compute thread), exposed <= busy, so the
// hidden share is in [0, 1].
struct CommTimes {
  double busy_s = 0.0;
  double exposed_s = 0.0;
  double handoff_s = 0.0;
  double hidden_fraction() const { return busy_s > 0.0 ? 1.0 - exposed_s / busy_s : 0.0; }
  // Everything the compute thread spent waiting on handles.
  double waited_s() const { return exposed_s + handoff_s; }
};

// One queued collective. A default-made handle is complete (a collective that ran at once, as on a
// group of one rank). A handle dropped unwaited leaves its collective to run: its buffers must
// outlive it.
class CommHandle {
 public:
  CommHandle() = default;
  // Returns once the collective has run (its output is written); rethrows its error. Waiting
  // again is a no-op. Time spent here, the collective not yet done, counts as exposed while the
  // stream's thread runs a collective, else as hand-off (CommTimes).
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
  // The busy time so far at `now`, the running collective's part included (mutex_ held).
  int64_t busy_until(int64_t now) const;

  int64_t busy_ns_ = 0, exposed_ns_ = 0, handoff_ns_ = 0;
  int64_t running_since_ns_ = -1;  // when the running collective started; -1: none runs
  std::thread thread_;             // last: starts once the rest is built
};

}  // namespace titan
