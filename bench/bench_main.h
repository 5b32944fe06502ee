// The one entry point of the benchmarks that have a run(argc, argv): an exception becomes one
// line naming the benchmark, and exit status 1.
#pragma once

#include <cstdio>
#include <exception>

namespace titan::bench {

inline int run_main(const char* name, int (*run)(int, char**), int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", name, e.what());
    return 1;
  }
}

}  // namespace titan::bench
