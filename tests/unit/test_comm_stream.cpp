// The communication stream (distributed/comm_stream.h): work runs on one other thread in submission
// order, a handle's wait returns once its work has run and rethrows its error, the stream runs
// what is queued before it stops, and the times add up. Over MPI it is exercised by
// tests/e2e/train_data_parallel.sh (FSDP against one process, a hung rank ended by the watchdog).
#include <gtest/gtest.h>

#include <future>
#include <string>
#include <thread>
#include <vector>

#include "titan/core/error.h"
#include "titan/distributed/comm_stream.h"
#include "titan/distributed/communicator.h"

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
  EXPECT_EQ(stream.times().hidden_fraction(), 0.0);
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

}  // namespace
}  // namespace titan
