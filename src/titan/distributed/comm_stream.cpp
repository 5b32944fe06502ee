#include "titan/distributed/comm_stream.h"

#include <chrono>

#include "titan/core/clock.h"
#include "titan/core/profile.h"

namespace titan {

struct CommHandle::Task {
  std::function<void()> work;
  CommStream* stream = nullptr;
  bool done = false;  // under the stream's mutex
  std::exception_ptr error;
};

void CommHandle::wait() {
  if (!task_) return;
  const std::shared_ptr<Task> task = std::move(task_);
  task->stream->wait(*task);
}

CommStream::CommStream(std::function<void()> idle, int64_t idle_period_ns)
    : idle_(std::move(idle)), idle_period_ns_(idle_period_ns), thread_([this] { work_loop(); }) {}

CommStream::~CommStream() {
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  queued_.notify_one();
  thread_.join();
}

CommHandle CommStream::submit(std::function<void()> work) {
  auto task = std::make_shared<CommHandle::Task>();
  task->work = std::move(work);
  task->stream = this;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(task);
  }
  queued_.notify_one();
  return CommHandle(std::move(task));
}

void CommStream::run(std::function<void()> work) {
  submit(std::move(work)).wait();
}

void CommStream::wait(CommHandle::Task& task) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!task.done) {
    const ProfileSpan span("wait for collective", SpanKind::wait);
    const int64_t t0 = now_ns(), busy0 = busy_until(t0);
    finished_.wait(lock, [&] { return task.done; });
    const int64_t t1 = now_ns(), busy1 = busy_until(t1);
    exposed_ns_ += busy1 - busy0;
    handoff_ns_ += (t1 - t0) - (busy1 - busy0);
  }
  if (task.error) std::rethrow_exception(task.error);
}

void CommStream::work_loop() {
  name_profile_thread("communication");
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    const auto ready = [&] { return stopping_ || !queue_.empty(); };
    if (!idle_) {
      queued_.wait(lock, ready);
    } else if (!queued_.wait_for(lock, std::chrono::nanoseconds(idle_period_ns_), ready)) {
      lock.unlock();
      idle_();
      lock.lock();
      continue;
    }
    if (queue_.empty()) return;  // stopping, everything run
    const std::shared_ptr<CommHandle::Task> task = std::move(queue_.front());
    queue_.pop_front();
    running_since_ns_ = now_ns();
    lock.unlock();
    try {
      task->work();
    } catch (...) {
      task->error = std::current_exception();
    }
    task->work = nullptr;  // what it captured goes now, not with the last handle
    lock.lock();
    busy_ns_ = busy_until(now_ns());
    running_since_ns_ = -1;
    task->done = true;
    finished_.notify_all();
  }
}

int64_t CommStream::busy_until(int64_t now) const {
  return busy_ns_ + (running_since_ns_ >= 0 ? now - running_since_ns_ : 0);
}

CommTimes CommStream::times() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return {static_cast<double>(busy_ns_) * 1e-9, static_cast<double>(exposed_ns_) * 1e-9,
          static_cast<double>(handoff_ns_) * 1e-9};
}

void CommStream::reset_times() {
  const std::lock_guard<std::mutex> lock(mutex_);
  // A collective running now counts from here on.
  if (running_since_ns_ >= 0) running_since_ns_ = now_ns();
  busy_ns_ = 0;
  exposed_ns_ = 0;
  handoff_ns_ = 0;
}

}  // namespace titan
