#include "titan/backend/cpu/threads.h"

#include <omp.h>
#include <unistd.h>

#include <cstdlib>

#include "titan/backend/cpu/cpu_info.h"
#include "titan/core/error.h"

namespace titan {

int default_thread_count() {
  return cpu_info().physical_cores;
}

void set_thread_count(int n) {
  TITAN_CHECK(n >= 1, "thread count must be at least 1, got ", n);
  omp_set_num_threads(n);
}

int thread_count() {
  return omp_get_max_threads();
}

void reexec_with_short_omp_spin(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr) {
    return;
  }
  setenv("OMP_WAIT_POLICY", "passive", 1);
  setenv("GOMP_SPINCOUNT", kDecodeSpinCount, 1);
  execv("/proc/self/exe", argv);
  // exec failed: this process keeps libgomp's defaults; leave the environment saying so.
  unsetenv("OMP_WAIT_POLICY");
  unsetenv("GOMP_SPINCOUNT");
}

}  // namespace titan
