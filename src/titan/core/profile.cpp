#include "titan/core/profile.h"

#include <mutex>

namespace titan {
namespace {

std::mutex g_mutex;  // guards what follows
std::vector<ProfileSpanRecord> g_spans;
int64_t g_started_ns = 0;
std::vector<std::pair<int32_t, const char*>> g_thread_names;
std::atomic<int32_t> g_next_thread{0};

}  // namespace

namespace profile_detail {

std::atomic<bool> recording{false};

void keep(const char* name, SpanKind kind, int64_t start_ns) {
  const int64_t end_ns = now_ns();
  const int32_t thread = profile_thread_id();
  const std::lock_guard<std::mutex> lock(g_mutex);
  // A span begun in an earlier recording, or ending after this one stopped, is not this one's.
  if (!recording.load(std::memory_order_relaxed) || start_ns < g_started_ns) return;
  g_spans.push_back({name, kind, thread, start_ns, end_ns});
}

}  // namespace profile_detail

const char* span_kind_name(SpanKind kind) {
  switch (kind) {
    case SpanKind::kernel:
      return "kernel";
    case SpanKind::collective:
      return "collective";
    case SpanKind::wait:
      return "wait";
    case SpanKind::phase:
      return "phase";
  }
  return "?";
}

void profile_start_recording() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_spans.clear();
  g_started_ns = now_ns();
  profile_detail::recording.store(true, std::memory_order_relaxed);
}

std::vector<ProfileSpanRecord> profile_stop_recording() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  profile_detail::recording.store(false, std::memory_order_relaxed);
  std::vector<ProfileSpanRecord> spans;
  spans.swap(g_spans);
  return spans;
}

int32_t profile_thread_id() {
  thread_local const int32_t id = g_next_thread.fetch_add(1, std::memory_order_relaxed);
  return id;
}

void name_profile_thread(const char* name) {
  const int32_t id = profile_thread_id();
  const std::lock_guard<std::mutex> lock(g_mutex);
  g_thread_names.emplace_back(id, name);
}

std::vector<std::pair<int32_t, const char*>> profile_thread_names() {
  const std::lock_guard<std::mutex> lock(g_mutex);
  return g_thread_names;
}

}  // namespace titan
