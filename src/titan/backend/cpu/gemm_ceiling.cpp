#include <algorithm>
#include <chrono>
#include <vector>

#include "titan/backend/cpu/gemm.h"
#include "titan/core/dtype.h"

namespace titan {
namespace {

constexpr int64_t kSide = 2048;

// GFLOP/s of the best of seven kSide^3 products `gemm` runs, after a warm-up run.
template <typename Gemm>
double best_of_seven(const Gemm& gemm) {
  double best = 1e30;
  for (int rep = 0; rep < 8; ++rep) {  // the first run warms caches and thread pools
    const auto t0 = std::chrono::steady_clock::now();
    gemm();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (rep > 0) best = std::min(best, s);
  }
  return 2.0 * kSide * kSide * kSide / best * 1e-9;
}

}  // namespace

double measure_gemm_ceiling_gflops() {
  const int64_t n = kSide;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  return best_of_seven([&] {
    gemm_f32(Trans::no, Trans::no, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
}

double measure_gemm_bf16_ceiling_gflops() {
  const int64_t n = kSide;
  std::vector<uint16_t> a(n * n, f32_to_bf16(0.5f)), b(n * n, f32_to_bf16(0.25f));
  std::vector<float> c(n * n);
  return best_of_seven([&] {
    gemm_bf16(Trans::no, Trans::no, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  });
}

}  // namespace titan
