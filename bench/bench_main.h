// What the benchmarks share: the entry point of those that have a run(argc, argv) (an exception
// becomes one line naming the benchmark, and exit status 1), the clock they time with, and the
// in-memory copy the I/O benchmarks report their rates against.
#pragma once

#include <cstddef>
#include <cstdio>
#include <cstring>
#include <exception>
#include <vector>

#include "titan/core/clock.h"

namespace titan::bench {

inline int run_main(const char* name, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return 1;
  }
}

// The clock the engine times with (core/clock.h).
using ::titan::now_seconds;

// Seconds one thread takes to copy `bytes` from one buffer to another, both touched before.
inline double memcpy_seconds(size_t bytes) {
  std::vector<char> from(bytes, 1), to(bytes, 0);
  const double start = now_seconds();
  std::memcpy(to.data(), from.data(), bytes);
  return now_seconds() - start;
}

}  // namespace titan::bench
