#include <algorithm>
#include <chrono>
#include <vector>

#include "titan/backend/cpu/gemm.h"

namespace titan {

double measure_gemm_ceiling_gflops() {
  constexpr int64_t n = 2048;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  double best = 1e30;
  for (int rep = 0; rep < 8; ++rep) {  // the first run warms caches and thread pools
    const auto t0 = std::chrono::steady_clock::now();
    gemm_f32(Trans::no, Trans::no, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, s);
  }
  return 2.0 * n * n * n / best * 1e-9;
}

}  // namespace titan
