// The communication stream (distributed/comm_stream.h): work runs on one other thread in submission
// order, a handle's wait returns once its work has run and rethrows its error, the stream runs
// what is queued before it stops, the times add up, and its idle turns come while nothing is
// queued, on its thread. The heartbeats' bookkeeping (distributed/heartbeat.h): silent and lagging
// ranks named. Over MPI the heartbeats are exercised by tests/e2e/train_stopped_rank.sh. Over MPI
// it is exercised by tests/e2e/train_data_parallel.sh (FSDP against one process, a hung rank ended
// by the watchdog).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include "titan/core/clock.h"
#include "titan/core/error.h"
#include "titan/distributed/comm_stream.h"
#include "titan/distributed/communicator.h"
#include "titan/distributed/heartbeat.h"

namespace titan {
namespace {

TEST(CommStream, RunsWorkInSubmissionOrderOnOneOtherThread) {
  CommStream stream;
  std::vector<int> order;
  std::vector<std::thread::id> threads;
  std::vector<CommHandle> handles;
  for (int i = 0; i < 100; ++i) {
    handles.push_back(stream.submit([&, i] {
      order.push_back(i);
      threads.push_back(std::this_thread::get_id());
    }));
  }
  handles.back().wait();  // the last one done means every one before it is
  ASSERT_EQ(order.size(), 100u);
  for (int i = 0; i < 100; ++i) EXPECT_EQ(order[i], i);
  for (const std::thread::id& t : threads) {
    EXPECT_EQ(t, threads.front());
    EXPECT_NE(t, std::this_thread::get_id());
  }
}

TEST(CommStream, WaitReturnsOnceTheWorkHasRun) {
  CommStream stream;
  std::promise<void> gate;
  std::shared_future<void> opened = gate.get_future().share();
  int written = 0;
  CommHandle handle = stream.submit([&] {
    opened.wait();
    written = 42;
  });
  EXPECT_TRUE(handle.pending());
  std::thread opener([&] { gate.set_value(); });
  handle.wait();
  EXPECT_EQ(written, 42);
  EXPECT_FALSE(handle.pending());
  handle.wait();  // again: nothing to wait for
  opener.join();
}

TEST(CommStream, WaitRethrowsTheWorksErrorAndLaterWorkStillRuns) {
  CommStream stream;
  CommHandle failed = stream.submit([] { throw Error("all_gather: 3000000000 elements"); });
  bool ran = false;
  CommHandle later = stream.submit([&] { ran = true; });
  try {
    failed.wait();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), "all_gather: 3000000000 elements");
  }
  later.wait();
  EXPECT_TRUE(ran);
}

TEST(CommStream, RunsWhatIsQueuedBeforeItStops) {
  int ran = 0;
  {
    CommStream stream;
    for (int i = 0; i < 10; ++i) stream.submit([&] { ++ran; });
  }
  EXPECT_EQ(ran, 10);
}

TEST(CommStream, WaitingOnWorkAlreadyDoneAddsNoExposedTime) {
  CommStream stream;
  CommHandle first = stream.submit([] {});
  CommHandle second = stream.submit([] {});
  second.wait();
  const CommTimes before = stream.times();
  first.wait();  // ran before the second
  const CommTimes after = stream.times();
  EXPECT_EQ(after.exposed_s, before.exposed_s);
  EXPECT_GE(after.busy_s, 0.0);
  stream.reset_times();
  EXPECT_EQ(stream.times().busy_s, 0.0);
  EXPECT_EQ(stream.times().exposed_s, 0.0);
  EXPECT_EQ(stream.times().handoff_s, 0.0);
  EXPECT_EQ(stream.times().hidden_fraction(), 0.0);
}

// Collectives submitted and waited for at once (as an all-to-all-v or a TP all-reduce is): the
// compute thread's waits are longer than the collectives by the hand-offs between the threads,
// which count apart, so the exposed part never exceeds the busy time (the hidden share is in
// [0, 1]) and exposed + hand-off is the whole wait.
TEST(CommStream, WaitsBeyondTheCollectivesCountAsHandOffNotExposed) {
  CommStream stream;
  double waited_s = 0.0;
  for (int i = 0; i < 200; ++i) {
    const int64_t t0 = now_ns();
    stream.run([] {});
    waited_s += static_cast<double>(now_ns() - t0) * 1e-9;
  }
  const CommTimes c = stream.times();
  EXPECT_LE(c.exposed_s, c.busy_s);
  EXPECT_GE(c.exposed_s, 0.0);
  EXPECT_GE(c.handoff_s, 0.0);
  EXPECT_GE(c.hidden_fraction(), 0.0);
  EXPECT_LE(c.hidden_fraction(), 1.0);
  EXPECT_LE(c.waited_s(), waited_s);
  EXPECT_GT(c.handoff_s, 0.0);  // each wait at least outlasts the other thread's wake-up
}

TEST(CommStream, AGroupOfOneRankCopiesAtOnce) {
  std::unique_ptr<Communicator> one = make_single_rank_communicator();
  std::vector<float> in = {1.0f, 2.0f, 3.0f};
  std::vector<float> out(3, 0.0f);
  CommHandle gathered = one->all_gather_async({{out.data(), in.data(), {3}, DType::f32}});
  EXPECT_FALSE(gathered.pending());
  EXPECT_EQ(out, in);
  std::vector<float> reduced(3, 0.0f);
  EXPECT_FALSE(
      one->reduce_scatter_sum_async({{in.data(), reduced.data(), {3}, DType::f32}}).pending());
  EXPECT_EQ(reduced, in);
}

TEST(CommStream, IdleTurnsRunOnItsThreadWhileNothingIsQueued) {
  std::atomic<int> turns{0};
  std::thread::id idle_thread;
  std::atomic<bool> seen{false};
  {
    CommStream stream(
        [&] {
          if (!seen.exchange(true)) idle_thread = std::this_thread::get_id();
          ++turns;
        },
        1'000'000);  // every millisecond
    std::thread::id work_thread;
    stream.run([&] { work_thread = std::this_thread::get_id(); });
    for (int i = 0; i < 2000 && turns < 5; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    stream.run([] {});  // work still runs between idle turns
    EXPECT_GE(turns.load(), 5);
    EXPECT_EQ(idle_thread, work_thread);
  }
  const int after_stop = turns;
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(turns.load(), after_stop);
}

constexpr int64_t kSecond = 1'000'000'000;

TEST(PeerBeats, NamesThePeersSilentUpToTheLastLook) {
  PeerBeats beats(/*rank=*/0, /*size=*/4, /*now_ns=*/0);
  EXPECT_TRUE(beats.silent(30 * kSecond, 0, 5 * kSecond).empty());
  beats.heard(1, 3, 20 * kSecond);
  beats.heard(3, 3, 25 * kSecond);
  beats.looked(31 * kSecond);
  // Rank 2 never beat since start-up; rank 0 is this rank.
  EXPECT_EQ(beats.silent(30 * kSecond, 31 * kSecond, 5 * kSecond), std::vector<int>({2}));
  EXPECT_EQ(beats.silent(10 * kSecond, 31 * kSecond, 5 * kSecond), std::vector<int>({1, 2}));
  EXPECT_EQ(beats.silent_seconds(1), 11);
  // This rank's own looking stopped (its thread held up): nobody is blamed.
  EXPECT_TRUE(beats.silent(10 * kSecond, 40 * kSecond, 5 * kSecond).empty());
}

TEST(PeerBeats, NamesThePeersBehindInCollectives) {
  PeerBeats beats(/*rank=*/2, /*size=*/3, /*now_ns=*/0);
  EXPECT_TRUE(beats.behind().empty());
  EXPECT_EQ(beats.enter_collective(), 1);
  EXPECT_EQ(beats.enter_collective(), 2);
  EXPECT_EQ(beats.entered(), 2);
  beats.heard(0, 2, kSecond);
  beats.heard(1, 1, kSecond);
  EXPECT_EQ(beats.behind(), std::vector<int>({1}));
  beats.heard(1, 3, 2 * kSecond);  // ahead is not behind
  EXPECT_TRUE(beats.behind().empty());
}

TEST(PeerBeats, RankListsReadAsEnglish) {
  EXPECT_EQ(rank_list({1}), "rank 1");
  EXPECT_EQ(rank_list({1, 2}), "ranks 1 and 2");
  EXPECT_EQ(rank_list({0, 2, 3}), "ranks 0, 2 and 3");
}

}  // namespace
}  // namespace titan
