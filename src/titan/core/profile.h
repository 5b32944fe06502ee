// Profile recording: spans of work (a kernel call, a collective, a phase of a training step), each
// timed on the thread that runs it, kept while a recording is on (train/profiling.h turns it on
// for the steps [profiling] names and writes what it kept as a Chrome/Perfetto trace). Off, a span
// costs a load and a predictable branch: no clock is read and nothing is kept, so what a run
// computes is the same either way.
#pragma once

#include <atomic>
#include <cstdint>
#include <utility>
#include <vector>

#include "titan/core/clock.h"

namespace titan {

// What a span is: the trace's "cat", by which its viewers filter and the tests sum.
enum class SpanKind { kernel, collective, wait, phase };
const char* span_kind_name(SpanKind kind);

struct ProfileSpanRecord {
  const char* name;  // a string that lives as long as the process (a literal)
  SpanKind kind;
  int32_t thread;            // profile_thread_id() of the thread it ran on
  int64_t start_ns, end_ns;  // core/clock.h's now_ns()
};

namespace profile_detail {
extern std::atomic<bool> recording;
// Keeps the span, if the recording is still on.
void keep(const char* name, SpanKind kind, int64_t start_ns);
}  // namespace profile_detail

inline bool profile_recording() {
  return profile_detail::recording.load(std::memory_order_relaxed);
}

// A span from construction to destruction on the calling thread, kept when a recording is on at
// both ends. `name` must outlive the process (a literal): only its pointer is kept.
class ProfileSpan {
 public:
  ProfileSpan(const char* name, SpanKind kind) {
    if (profile_recording()) [[unlikely]] {
      name_ = name;
      kind_ = kind;
      start_ns_ = now_ns();
    }
  }
  ~ProfileSpan() {
    if (name_ != nullptr) [[unlikely]]
      profile_detail::keep(name_, kind_, start_ns_);
  }
  ProfileSpan(const ProfileSpan&) = delete;
  ProfileSpan& operator=(const ProfileSpan&) = delete;

 private:
  const char* name_ = nullptr;  // set only when recording at construction
  SpanKind kind_ = SpanKind::phase;
  int64_t start_ns_ = 0;
};

// Starts keeping spans; a recording's spans are those that both begin and end while it is on.
void profile_start_recording();
// Stops, and returns the spans kept since the start, in the order they ended.
std::vector<ProfileSpanRecord> profile_stop_recording();

// The calling thread's number in traces (0, 1, ... in the order threads first record or are
// named), and a name for its row (threads not named are "thread <n>" in the trace).
int32_t profile_thread_id();
void name_profile_thread(const char* name);
// The named threads' numbers and names.
std::vector<std::pair<int32_t, const char*>> profile_thread_names();

}  // namespace titan
