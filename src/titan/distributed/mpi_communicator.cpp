// The MPI implementation of Communicator and of the world (distributed/world.h): the only file that
// includes mpi.h. MPI's default error handler stays (errors are fatal to the job), so a failed
// collective ends every rank instead of leaving the others waiting. Between init_world and
// finalize_world every MPI call runs on the process's communication stream
// (distributed/comm_stream.h): one thread, so MPI_THREAD_SERIALIZED suffices; the one exception is
// MPI_Abort, which ends the process from wherever the error is, the stream possibly stuck in a
// collective. The ranks' heartbeats (distributed/heartbeat.h) travel here too, on that thread.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "titan/core/clock.h"
#include "titan/core/error.h"
#include "titan/core/profile.h"
#include "titan/distributed/heartbeat.h"
#include "titan/distributed/world.h"

namespace titan {
namespace {

// Heartbeats (distributed/heartbeat.h) over a duplicate of MPI_COMM_WORLD, so that they never
// match a collective's messages: one message of 8 bytes per peer per second, a receive always
// posted from every peer. Its MPI calls run where every MPI call runs: on the communication
// thread (between collectives its idle turns, during one the wait loop), and on the main thread
// before that thread starts and after it stops.
class HeartbeatLink {
 public:
  static constexpr int64_t kLookNs = 100'000'000;    // how often arrived beats are taken in
  static constexpr int64_t kBeatNs = 1'000'000'000;  // how often this rank beats

  void start(int rank, int size) {
    MPI_Comm_dup(MPI_COMM_WORLD, &comm_);
    beats_ = std::make_unique<PeerBeats>(rank, size, now_ns());
    inbox_.assign(static_cast<size_t>(size), 0);
    outbox_.assign(static_cast<size_t>(size), 0);
    receives_.assign(static_cast<size_t>(size), MPI_REQUEST_NULL);
    sends_.assign(static_cast<size_t>(size), MPI_REQUEST_NULL);
    for (int p = 0; p < size; ++p) {
      if (p != rank) post_receive(p);
    }
  }
  // Cancels the receives and completes the sends (small: sent eagerly, done without the peer).
  void stop() {
    if (!beats_) return;
    for (MPI_Request& r : receives_) {
      if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
    }
    MPI_Waitall(static_cast<int>(receives_.size()), receives_.data(), MPI_STATUSES_IGNORE);
    MPI_Waitall(static_cast<int>(sends_.size()), sends_.data(), MPI_STATUSES_IGNORE);
    MPI_Comm_free(&comm_);
    beats_.reset();
  }
  PeerBeats* beats() const { return beats_.get(); }
  // Takes in what has arrived (at most every kLookNs) and beats (every kBeatNs); cheap otherwise.
  void tick() {
    if (!beats_) return;
    const int64_t now = now_ns();
    if (now - looked_ns_ < kLookNs) return;
    looked_ns_ = now;
    for (int p = 0; p < beats_->size(); ++p) {
      for (int arrived = 0; p != beats_->rank();) {
        MPI_Test(&receives_[p], &arrived, MPI_STATUS_IGNORE);
        if (arrived == 0) break;
        beats_->heard(p, inbox_[p], now);
        post_receive(p);
      }
    }
    beats_->looked(now);
    if (now - beat_ns_ < kBeatNs) return;
    beat_ns_ = now;
    for (int p = 0; p < beats_->size(); ++p) {
      int sent = 0;
      MPI_Test(&sends_[p], &sent, MPI_STATUS_IGNORE);  // one beat in flight per peer at most
      if (p == beats_->rank() || sent == 0) continue;
      outbox_[p] = beats_->entered();
      MPI_Isend(&outbox_[p], 1, MPI_INT64_T, p, kTag, comm_, &sends_[p]);
    }
  }

 private:
  static constexpr int kTag = 7;
  void post_receive(int peer) {
    MPI_Irecv(&inbox_[peer], 1, MPI_INT64_T, peer, kTag, comm_, &receives_[peer]);
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  std::unique_ptr<PeerBeats> beats_;
  std::vector<int64_t> inbox_, outbox_;  // per peer: the last beat received, the beat in flight
  std::vector<MPI_Request> receives_, sends_;
  int64_t looked_ns_ = 0, beat_ns_ = 0;
};

HeartbeatLink g_heartbeats;

// Watches the other ranks for this one: ends the job when a peer's heartbeats stop (a stopped or
// frozen rank, whatever this rank is doing) or when this rank's communication thread has waited
// in one collective longer than its timeout (naming the ranks that have not reached it). It cannot
// call MPI itself (only the stream's thread does), so it ends this rank with _Exit and leaves the
// rest to mpirun.
class Watchdog {
 public:
  ~Watchdog() { stop(); }
  void start(int rank, int size, const PeerBeats* beats) {
    rank_ = rank;
    size_ = size;
    beats_ = beats;
    thread_ = std::thread([this] { run(); });
  }
  void stop() {
    if (!thread_.joinable()) return;
    stopping_ = true;
    thread_.join();
  }
  void set_timeout(int64_t seconds, const char* key) {
    key_ = key;
    timeout_ns_ = to_ns(seconds);
  }
  void set_heartbeat_timeout(int64_t seconds, const char* key) {
    heartbeat_key_ = key;
    heartbeat_timeout_ns_ = to_ns(seconds);
  }
  void enter(const char* collective) {
    collective_ = collective;
    since_ns_ = now_ns();
  }
  void leave() { since_ns_ = 0; }

 private:
  // Beats not taken in for this long mean this rank's own communication thread is held up (in a
  // blocking MPI call): silence is not measured then.
  static constexpr int64_t kStaleNs = 5'000'000'000;
  // Beats missed for this long (a few) make a rank worth naming when a collective times out.
  static constexpr int64_t kQuietNs = 3'000'000'000;
  // Seconds as nanoseconds, a limit beyond 292 years taken as 292 years.
  static int64_t to_ns(int64_t seconds) {
    return std::min<int64_t>(seconds, INT64_MAX / 1'000'000'000) * 1'000'000'000;
  }

  void run() {
    int64_t woke = now_ns(), verdict_at = 0, timed_out_since = 0;
    while (!stopping_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      const int64_t now = now_ns(), heartbeat_timeout = heartbeat_timeout_ns_;
      // Asleep far longer than asked: this process was stopped or frozen itself; its waits and
      // the others' silence are measured afresh (were it continued, mpirun is likely ending it).
      const bool was_stopped = now - woke > kStaleNs;
      woke = now;
      if (was_stopped) {
        int64_t since = since_ns_;
        if (since != 0) since_ns_.compare_exchange_strong(since, now);
        verdict_at = 0;
        continue;
      }
      if (heartbeat_timeout > 0) {
        const std::vector<int> silent = beats_->silent(heartbeat_timeout, now, kStaleNs);
        if (!silent.empty()) {
          end_job(rank_list(silent) + " sent no heartbeat for " +
                  std::to_string(heartbeat_timeout / 1'000'000'000) + " s (comm." +
                  heartbeat_key_.load() + "): stopped, frozen or unreachable; ending the job");
        }
      }
      const int64_t since = since_ns_, timeout = timeout_ns_;
      if (since == 0 || timeout <= 0 || now - since < timeout) {
        verdict_at = 0;
        continue;
      }
      // Timed out: the verdict waits for a beat from every live peer, so that one that reached
      // the collective just now is not named; a collective that ends meanwhile ends nothing.
      if (verdict_at == 0 || timed_out_since != since) {
        verdict_at = now + HeartbeatLink::kBeatNs + 2 * HeartbeatLink::kLookNs;
        timed_out_since = since;
      }
      if (now < verdict_at) continue;
      end_job(std::string(collective_.load()) + " waited " +
              std::to_string(timeout / 1'000'000'000) + " s for the other ranks (comm." +
              key_.load() + "): " + waited_for(now) + "; ending the job");
    }
  }
  // The ranks a timed-out collective waits for: those behind in collectives by their last beat,
  // else those silent for a while (one stopped inside this very collective).
  std::string waited_for(int64_t now) const {
    const std::vector<int> behind = beats_->behind();
    if (!behind.empty()) {
      return rank_list(behind) + (behind.size() == 1 ? " has" : " have") + " not reached it";
    }
    const std::vector<int> silent = beats_->silent(kQuietNs, now, kStaleNs);
    if (!silent.empty()) {
      return rank_list(silent) + " sent no heartbeat for " +
             std::to_string(beats_->silent_seconds(silent.front())) + " s";
    }
    return "a rank is stuck";
  }
  // Every surviving rank comes to the same verdict within a beat or so: the pause lets theirs be
  // printed too before this rank's exit makes mpirun end them.
  [[noreturn]] void end_job(const std::string& why) const {
    std::fprintf(stderr, "[rank %d of %d] titan train: error: %s\n", rank_, size_, why.c_str());
    std::fflush(stderr);
    std::this_thread::sleep_for(std::chrono::seconds(2));
    std::_Exit(1);
  }

  std::thread thread_;
  int rank_ = 0, size_ = 1;
  const PeerBeats* beats_ = nullptr;
  std::atomic<bool> stopping_{false};
  std::atomic<int64_t> since_ns_{0}, timeout_ns_{0}, heartbeat_timeout_ns_{0};
  std::atomic<const char*> collective_{""}, key_{""}, heartbeat_key_{""};
};

Watchdog g_watchdog;

// The stream's thread is inside one collective while this lives: every MPI collective passes
// here, so this is where a profile's collective spans are taken (on the stream's thread).
class InCollective {
 public:
  explicit InCollective(const char* name) : span_(name, SpanKind::collective) {
    if (PeerBeats* beats = g_heartbeats.beats()) beats->enter_collective();
    g_watchdog.enter(name);
  }
  ~InCollective() { g_watchdog.leave(); }
  InCollective(const InCollective&) = delete;
  InCollective& operator=(const InCollective&) = delete;

 private:
  const ProfileSpan span_;
};

std::unique_ptr<CommStream> g_stream;  // between init_world and finalize_world under MPI

// `call` queued on the communication stream while there is one, else run here (before it starts
// and after it stops, this is the only thread calling MPI).
CommHandle queue(std::function<void()> call) {
  if (g_stream) return g_stream->submit(std::move(call));
  call();
  return {};
}

// Starts `n` nonblocking collectives (start(i, &request), in the same order on every rank) and
// waits for them all, testing them every 50 us and sleeping in between. OpenMPI's blocking
// collectives spin in its progress loop while a peer is not there yet; on a machine whose cores
// all compute, that spinning thread takes a core's share from the compute threads. The tests are
// what progress the transfers (OpenMPI has no progress thread of its own).
template <typename Start>
void complete_all(size_t n, Start&& start) {
  std::vector<MPI_Request> requests(n, MPI_REQUEST_NULL);
  for (size_t i = 0; i < n; ++i) start(i, &requests[i]);
  for (int done = 0;;) {
    MPI_Testall(static_cast<int>(n), requests.data(), &done, MPI_STATUSES_IGNORE);
    if (done != 0) return;
    g_heartbeats.tick();
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// One collective: start(&request).
template <typename Start>
void complete(Start&& start) {
  complete_all(1, [&](size_t, MPI_Request* request) { start(request); });
}

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
              " elements is more than one MPI call addresses");
  return static_cast<int>(count);
}

class MpiCommunicator final : public Communicator {
 public:
  MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    queue([this] {
      MPI_Comm_rank(comm_, &rank_);
      MPI_Comm_size(comm_, &size_);
    }).wait();
  }
  ~MpiCommunicator() override {
    int finalized = 0;
    MPI_Finalized(&finalized);  // callable from any thread at any time
    if (owned_ && !finalized) queue([this] { MPI_Comm_free(&comm_); }).wait();
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void all_reduce_sum(float* data, int64_t count) override {
    all_reduce(data, count, MPI_FLOAT, MPI_SUM);
  }
  void all_reduce_sum(double* data, int64_t count) override {
    all_reduce(data, count, MPI_DOUBLE, MPI_SUM);
  }
  void all_reduce_max(double* data, int64_t count) override {
    all_reduce(data, count, MPI_DOUBLE, MPI_MAX);
  }
  CommHandle all_gather_async(std::vector<CommPart> parts) override {
    std::vector<PartCall> calls = part_calls(parts, "all_gather");
    count(Collective::all_gather, whole_bytes(parts));
    return queue([calls = std::move(calls), comm = comm_, rank = rank_] {
      const InCollective watch("all_gather");
      complete_all(calls.size(), [&](size_t i, MPI_Request* r) {
        const PartCall& c = calls[i];
        MPI_Iallgatherv(c.own, c.counts[rank], c.type, c.whole, c.counts.data(), c.displs.data(),
                        c.type, comm, r);
      });
    });
  }
  CommHandle gather_async(std::vector<CommPart> parts, int root) override {
    TITAN_CHECK(root >= 0 && root < size_, "gather to rank ", root, " in a group of ", size_);
    std::vector<PartCall> calls = part_calls(parts, "gather");
    count(Collective::gather, whole_bytes(parts));
    return queue([calls = std::move(calls), comm = comm_, rank = rank_, root] {
      const InCollective watch("gather");
      complete_all(calls.size(), [&](size_t i, MPI_Request* r) {
        const PartCall& c = calls[i];
        MPI_Igatherv(c.own, c.counts[rank], c.type, c.whole, c.counts.data(), c.displs.data(),
                     c.type, root, comm, r);
      });
    });
  }
  CommHandle reduce_scatter_sum_async(std::vector<CommPart> parts) override {
    for (const CommPart& p : parts) {
      TITAN_CHECK(p.dtype == DType::f32, "reduce_scatter: a part in ", dtype_name(p.dtype));
    }
    std::vector<PartCall> calls = part_calls(parts, "reduce_scatter");
    count(Collective::reduce_scatter, whole_bytes(parts));
    return queue([calls = std::move(calls), comm = comm_] {
      const InCollective watch("reduce_scatter");
      complete_all(calls.size(), [&](size_t i, MPI_Request* r) {
        const PartCall& c = calls[i];
        MPI_Ireduce_scatter(c.whole, c.own, c.counts.data(), MPI_FLOAT, MPI_SUM, comm, r);
      });
    });
  }
  CommHandle all_to_all_v_async(const void* send, const std::vector<int64_t>& send_counts,
                                void* recv, const std::vector<int64_t>& recv_counts,
                                DType dtype) override {
    TITAN_CHECK(static_cast<int>(send_counts.size()) == size_ &&
                    static_cast<int>(recv_counts.size()) == size_,
                "all_to_all_v: counts for ", send_counts.size(), " and ", recv_counts.size(),
                " ranks in a group of ", size_);
    MPI_Datatype type = MPI_FLOAT;
    if (dtype == DType::bf16) {
      type = MPI_UINT16_T;
    } else if (dtype == DType::i32) {
      type = MPI_INT32_T;
    } else {
      TITAN_CHECK(dtype == DType::f32, "all_to_all_v: elements in ", dtype_name(dtype));
    }
    // MPI's int counts and displacements, per peer in rank order.
    std::vector<int> sends, send_at, recvs, recv_at;
    const auto cut = [](const std::vector<int64_t>& counts, std::vector<int>& n,
                        std::vector<int>& at) {
      int64_t offset = 0;
      for (const int64_t count : counts) {
        TITAN_CHECK(count >= 0, "all_to_all_v: a count of ", count);
        at.push_back(checked_count(offset, "all_to_all_v"));
        n.push_back(checked_count(count, "all_to_all_v"));
        offset += count;
      }
    };
    cut(send_counts, sends, send_at);
    cut(recv_counts, recvs, recv_at);
    int64_t leaving = 0;  // elements for the other ranks
    for (int p = 0; p < size_; ++p) leaving += p == rank_ ? 0 : send_counts[p];
    count(Collective::all_to_all_v, leaving * static_cast<int64_t>(dtype_size(dtype)));
    return queue([=, sends = std::move(sends), send_at = std::move(send_at),
                  recvs = std::move(recvs), recv_at = std::move(recv_at), comm = comm_] {
      const InCollective watch("all_to_all_v");
      complete([&](MPI_Request* r) {
        MPI_Ialltoallv(send, sends.data(), send_at.data(), type, recv, recvs.data(), recv_at.data(),
                       type, comm, r);
      });
    });
  }
  std::vector<int64_t> all_to_all_counts(const std::vector<int64_t>& send_counts) override {
    TITAN_CHECK(static_cast<int>(send_counts.size()) == size_, "all_to_all_counts: counts for ",
                send_counts.size(), " ranks in a group of ", size_);
    std::vector<int64_t> recv_counts(send_counts.size(), 0);
    count(Collective::all_to_all_counts,
          static_cast<int64_t>(sizeof(int64_t)) * (static_cast<int64_t>(size_) - 1));
    queue([&, comm = comm_] {
      const InCollective watch("all_to_all_counts");
      complete([&](MPI_Request* r) {
        MPI_Ialltoall(send_counts.data(), 1, MPI_INT64_T, recv_counts.data(), 1, MPI_INT64_T, comm,
                      r);
      });
    }).wait();
    return recv_counts;
  }
  void broadcast(float* data, int64_t count, int root) override {
    Communicator::count(Collective::broadcast, count * static_cast<int64_t>(sizeof(float)));
    queue([=, comm = comm_] {
      const InCollective watch("broadcast");
      in_chunks(count, [&](int64_t at, int n) {
        complete([&](MPI_Request* r) { MPI_Ibcast(data + at, n, MPI_FLOAT, root, comm, r); });
      });
    }).wait();
  }
  void barrier() override {
    count(Collective::barrier, 0);
    queue([comm = comm_] {
      const InCollective watch("barrier");
      complete([&](MPI_Request* r) { MPI_Ibarrier(comm, r); });
    }).wait();
  }
  std::unique_ptr<Communicator> split(int color, int key) override {
    MPI_Comm sub = MPI_COMM_NULL;
    queue([&, comm = comm_] {
      const InCollective watch("split");
      MPI_Comm_split(comm, color, key, &sub);
    }).wait();
    return std::make_unique<MpiCommunicator>(sub, true);
  }

 private:
  // A CommPart as MPI's v-collectives take it: int counts and displacements.
  struct PartCall {
    void* whole;
    void* own;
    std::vector<int> counts, displs;
    MPI_Datatype type;
  };
  std::vector<PartCall> part_calls(const std::vector<CommPart>& parts, const char* what) const {
    std::vector<PartCall> calls;
    for (const CommPart& p : parts) {
      TITAN_CHECK(static_cast<int>(p.counts.size()) == size_, what, ": a part cut for ",
                  p.counts.size(), " ranks in a group of ", size_);
      PartCall c{p.whole, p.own, {}, {}, p.dtype == DType::bf16 ? MPI_UINT16_T : MPI_FLOAT};
      int64_t at = 0;
      for (const int64_t count : p.counts) {
        c.displs.push_back(checked_count(at, what));
        c.counts.push_back(checked_count(count, what));
        at += count;
      }
      checked_count(at, what);
      calls.push_back(std::move(c));
    }
    return calls;
  }

  template <typename T>
  void all_reduce(T* data, int64_t count, MPI_Datatype type, MPI_Op op) {
    Communicator::count(Collective::all_reduce, count * static_cast<int64_t>(sizeof(T)));
    queue([=, comm = comm_] {
      const InCollective watch("all_reduce");
      in_chunks(count, [&](int64_t at, int n) {
        complete(
            [&](MPI_Request* r) { MPI_Iallreduce(MPI_IN_PLACE, data + at, n, type, op, comm, r); });
      });
    }).wait();
  }

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
  // One thread at a time calls MPI: this one until the communication stream starts, then the
  // stream's (OpenMP teams and the data loader's thread never do).
  MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided);
  g_mpi = true;
  MPI_Comm_rank(MPI_COMM_WORLD, &g_info.rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_info.size);
  if (provided < MPI_THREAD_SERIALIZED) {
    std::fprintf(stderr,
                 "[rank %d of %d] titan: error: this MPI library gives thread support level %d, "
                 "below MPI_THREAD_SERIALIZED (%d) that the communication thread needs; use an "
                 "MPI built with thread support (OpenMPI's is)\n",
                 g_info.rank, g_info.size, provided, MPI_THREAD_SERIALIZED);
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  MPI_Comm local = MPI_COMM_NULL;
  MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, g_info.rank, MPI_INFO_NULL, &local);
  MPI_Comm_rank(local, &g_info.local_rank);
  MPI_Comm_size(local, &g_info.local_size);
  MPI_Comm_free(&local);
  g_heartbeats.start(g_info.rank, g_info.size);
  g_watchdog.start(g_info.rank, g_info.size, g_heartbeats.beats());
  g_stream = std::make_unique<CommStream>([] { g_heartbeats.tick(); }, HeartbeatLink::kLookNs);
  g_world = std::make_unique<MpiCommunicator>(MPI_COMM_WORLD, false);
}

void finalize_world() {
  if (!g_mpi) return;
  g_world.reset();
  g_stream.reset();  // runs what is queued; MPI is this thread's again
  g_watchdog.stop();
  g_heartbeats.stop();
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

CommTimes collective_times() {
  return g_stream ? g_stream->times() : CommTimes{};
}

void reset_collective_times() {
  if (g_stream) g_stream->reset_times();
}

void set_collective_timeout(int64_t seconds, const char* key) {
  g_watchdog.set_timeout(seconds, key);
}

void set_heartbeat_timeout(int64_t seconds, const char* key) {
  g_watchdog.set_heartbeat_timeout(seconds, key);
}

void abort_world(int code) {
  g_watchdog.stop();
  if (g_mpi) MPI_Abort(MPI_COMM_WORLD, code);
  std::exit(code);
}

}  // namespace titan
