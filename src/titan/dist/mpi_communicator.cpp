// The MPI implementation of Communicator and of the world (dist/world.h): the only file that
// includes mpi.h. MPI's default error handler stays (errors are fatal to the job), so a failed
// collective ends every rank instead of leaving the others waiting.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "titan/core/error.h"
#include "titan/dist/world.h"

namespace titan {
namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Watches the collective the main thread is in (only it calls MPI). It cannot call MPI itself
// (MPI_THREAD_FUNNELED), so it ends this rank with _Exit and leaves the rest to mpirun.
class Watchdog {
 public:
  ~Watchdog() { stop(); }
  void start() {
    thread_ = std::thread([this] { run(); });
  }
  void stop() {
    if (!thread_.joinable()) return;
    stopping_ = true;
    thread_.join();
  }
  void set_timeout(int64_t seconds, const char* key) {
    key_ = key;
    timeout_ns_ = seconds * 1'000'000'000;
  }
  void enter(const char* collective) {
    collective_ = collective;
    since_ns_ = now_ns();
  }
  void leave() { since_ns_ = 0; }

 private:
  void run() {
    while (!stopping_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const int64_t since = since_ns_, timeout = timeout_ns_;
      if (since == 0 || timeout <= 0 || now_ns() - since < timeout) continue;
      int rank = 0, size = 0;
      MPI_Comm_rank(MPI_COMM_WORLD, &rank);  // allowed from any thread: no communication
      MPI_Comm_size(MPI_COMM_WORLD, &size);
      std::fprintf(stderr,
                   "[rank %d of %d] titan train: error: %s waited %lld s for the other ranks "
                   "(comm.%s): a rank is stuck; ending the job\n",
                   rank, size, collective_.load(), static_cast<long long>(timeout / 1'000'000'000),
                   key_.load());
      std::fflush(stderr);
      std::_Exit(1);
    }
  }

  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> since_ns_{0}, timeout_ns_{0};
  std::atomic<const char*> collective_{""}, key_{""};
};

Watchdog g_watchdog;

// The main thread is inside one collective while this lives.
class InCollective {
 public:
  explicit InCollective(const char* name) { g_watchdog.enter(name); }
  ~InCollective() { g_watchdog.leave(); }
  InCollective(const InCollective&) = delete;
  InCollective& operator=(const InCollective&) = delete;
};

// MPI counts are ints: reductions and broadcasts go in chunks of at most this many elements.
constexpr int64_t kMaxChunk = int64_t{1} << 30;

template <typename Fn>
void in_chunks(int64_t count, Fn&& fn) {
  for (int64_t at = 0; at < count; at += kMaxChunk) {
    fn(at, static_cast<int>(std::min(kMaxChunk, count - at)));
  }
}

int checked_count(int64_t count, const char* what) {
  TITAN_CHECK(count >= 0 && count <= INT_MAX, what, ": ", count,
              " elements per rank is more than one MPI call takes");
  return static_cast<int>(count);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, int64_t count) override {
    const InCollective watch("all_reduce");
    in_chunks(count, [&](int64_t at, int n) {
      MPI_Allreduce(MPI_IN_PLACE, data + at, n, MPI_FLOAT, MPI_SUM, comm_);
    });
  }
  void all_reduce_sum(double* data, int64_t count) override {
    const InCollective watch("all_reduce");
    in_chunks(count, [&](int64_t at, int n) {
      MPI_Allreduce(MPI_IN_PLACE, data + at, n, MPI_DOUBLE, MPI_SUM, comm_);
    });
  }
  void all_reduce_max(double* data, int64_t count) override {
    const InCollective watch("all_reduce");
    in_chunks(count, [&](int64_t at, int n) {
      MPI_Allreduce(MPI_IN_PLACE, data + at, n, MPI_DOUBLE, MPI_MAX, comm_);
    });
  }
  void all_gather(float* out, const float* in, int64_t count) override {
    const InCollective watch("all_gather");
    const int n = checked_count(count, "all_gather");
    MPI_Allgather(in, n, MPI_FLOAT, out, n, MPI_FLOAT, comm_);
  }
  void reduce_scatter_sum(float* out, const float* in, int64_t count) override {
    const InCollective watch("reduce_scatter");
    const int n = checked_count(count, "reduce_scatter");
    MPI_Reduce_scatter_block(in, out, n, MPI_FLOAT, MPI_SUM, comm_);
  }
  void broadcast(float* data, int64_t count, int root) override {
    const InCollective watch("broadcast");
    in_chunks(count, [&](int64_t at, int n) { MPI_Bcast(data + at, n, MPI_FLOAT, root, comm_); });
  }
  void barrier() override {
    const InCollective watch("barrier");
    MPI_Barrier(comm_);
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    MPI_Comm_split(comm_, color, key, &sub);
    return std::make_unique<MpiCommunicator>(sub, true);
  }

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0, size_ = 1;
};

WorldInfo g_info;
std::unique_ptr<Communicator> g_world;
bool g_mpi = false;

}  // namespace

bool launched_by_mpi() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"}) {
    if (std::getenv(name) != nullptr) return true;
  }
  return false;
}

void init_world(int* argc, char*** argv) {
  if (g_world) return;
  if (!launched_by_mpi()) {
    g_world = make_single_rank_communicator();
    return;
  }
  int provided = 0;
  // Only the main thread calls MPI (OpenMP teams and the data loader's thread never do).
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  g_mpi = true;
  g_watchdog.start();
  g_world = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false);
  g_info.rank = g_world->rank();
  g_info.size = g_world->size();
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_info.rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &g_info.local_rank);
  MPI_Comm_size(local, &g_info.local_size);
  MPI_Comm_free(&local);
}

void finalize_world() {
  if (!g_mpi) return;
  g_watchdog.stop();
  g_world.reset();
  MPI_Finalize();
  g_mpi = false;
}

const WorldInfo& world_info() {
  return g_info;
}

Communicator& world() {
  if (!g_world) g_world = make_single_rank_communicator();  // a library user without init_world
  return *g_world;
}

void set_collective_timeout(int64_t seconds, const char* key) {
  g_watchdog.set_timeout(seconds, key);
}

void abort_world(int code) {
  g_watchdog.stop();
  if (g_mpi) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace titan
