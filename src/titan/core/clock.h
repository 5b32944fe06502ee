// The steady clock as a number from an arbitrary origin: the difference of two readings times
// something (a step, a collective's wait); a single reading means nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace titan {

inline int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

inline double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A duration for people: "12.3s" under a minute, then "4m05s", "1h02m03s"; "?" when not finite.
std::string format_duration(double seconds);

}  // namespace titan
