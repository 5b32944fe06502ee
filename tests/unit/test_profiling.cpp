// Profile recording (core/profile.h), the kernel function type that times every kernel call
// (dispatch/kernel_fn.h) and the trace written from the spans (train/profiling.h): nothing kept
// while off, spans nested as run, the trace's Chrome fields, the kernels' share of the steps.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <string_view>
#include <thread>

#include "titan/core/profile.h"
#include "titan/dispatch/kernel_fn.h"
#include "titan/train/profiling.h"

namespace titan {
namespace {

int twice(int x) {
  return 2 * x;
}

TEST(Profile, KeepsSpansOnlyWhileRecording) {
  { const ProfileSpan span("before", SpanKind::phase); }
  profile_start_recording();
  {
    const ProfileSpan outer("outer", SpanKind::phase);
    const ProfileSpan inner("inner", SpanKind::kernel);
  }
  std::thread([] {
    name_profile_thread("other");
    const ProfileSpan span("elsewhere", SpanKind::collective);
  }).join();
  const std::vector<ProfileSpanRecord> spans = profile_stop_recording();
  { const ProfileSpan span("after", SpanKind::phase); }
  ASSERT_EQ(spans.size(), 3u);
  // Kept as they end: the inner one first.
  EXPECT_EQ(std::string_view(spans[0].name), "inner");
  EXPECT_EQ(std::string_view(spans[1].name), "outer");
  EXPECT_EQ(std::string_view(spans[2].name), "elsewhere");
  EXPECT_LE(spans[1].start_ns, spans[0].start_ns);
  EXPECT_LE(spans[0].end_ns, spans[1].end_ns);
  EXPECT_EQ(spans[0].thread, profile_thread_id());
  EXPECT_NE(spans[2].thread, profile_thread_id());
  EXPECT_EQ(spans[2].kind, SpanKind::collective);
  EXPECT_TRUE(profile_stop_recording().empty());
}

TEST(Profile, KernelFnTimesItsCallsUnderItsLabel) {
  const KernelFn<int (*)(int), "test.twice"> fn = twice;
  const KernelFn<int (*)(int), "test.lambda"> lambda = [](int x) { return x + 1; };
  const KernelFn<int (*)(int), "test.none"> none = nullptr;
  EXPECT_TRUE(none == nullptr);
  EXPECT_FALSE(fn == nullptr);
  EXPECT_EQ(fn(3), 6);  // not recording: nothing kept
  profile_start_recording();
  EXPECT_EQ(fn(4), 8);
  EXPECT_EQ(lambda(4), 5);
  const std::vector<ProfileSpanRecord> spans = profile_stop_recording();
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(std::string_view(spans[0].name), "test.twice");
  EXPECT_EQ(std::string_view(spans[1].name), "test.lambda");
  EXPECT_EQ(spans[0].kind, SpanKind::kernel);
  static_assert(sizeof(fn) == sizeof(int (*)(int)), "a kernel plugin's tables keep their layout");
}

TEST(Profile, ChromeTraceAndKernelShare) {
  // Two steps of 100 us on thread 0 with 60 us and 30 us of kernels, a kernel between them
  // (validation: not the steps'), a collective on thread 1.
  const std::vector<ProfileSpanRecord> spans = {{"k", SpanKind::kernel, 0, 10'000, 70'000},
                                                {"step", SpanKind::phase, 0, 0, 100'000},
                                                {"k", SpanKind::kernel, 0, 150'000, 190'000},
                                                {"k", SpanKind::kernel, 0, 200'000, 230'000},
                                                {"step", SpanKind::phase, 0, 200'000, 300'000},
                                                {"c", SpanKind::collective, 1, 210'000, 220'000}};
  EXPECT_DOUBLE_EQ(kernel_share_of_steps(spans), 90.0 / 200.0);
  const nlohmann::json trace = nlohmann::json::parse(chrome_trace_json(spans, 3, 7));
  std::vector<int64_t> steps;
  int spans_seen = 0;
  double last_ts = -1;
  for (const nlohmann::json& e : trace.at("traceEvents")) {
    EXPECT_EQ(e.at("pid"), 3);
    if (e.at("ph") == "M") continue;
    ++spans_seen;
    EXPECT_EQ(e.at("ph"), "X");
    EXPECT_GE(e.at("ts").get<double>(), last_ts);  // in start order
    last_ts = e.at("ts").get<double>();
    if (e.at("name") == "step") steps.push_back(e.at("args").at("step").get<int64_t>());
    if (e.at("name") == "c") {
      EXPECT_EQ(e.at("cat"), "collective");
      EXPECT_DOUBLE_EQ(e.at("ts").get<double>(), 210.0);
      EXPECT_DOUBLE_EQ(e.at("dur").get<double>(), 10.0);
      EXPECT_EQ(e.at("tid"), 1);
    }
  }
  EXPECT_EQ(spans_seen, 6);
  EXPECT_EQ(steps, (std::vector<int64_t>{7, 8}));
}

}  // namespace
}  // namespace titan
