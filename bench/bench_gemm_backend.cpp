// GEMM throughput through the backend interface on the shapes a Qwen3 training step uses: fp32
// called directly (oneDNN's sgemm) and through backend() -- the interface must cost nothing --
// and bf16 operands with fp32 accumulation (oneDNN's matmul), for docs/GEMM.md.
// Usage: bench_gemm_backend [threads]
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_main.h"
#include "titan/backend/backend.h"
#include "titan/backend/cpu/gemm.h"
#include "titan/backend/cpu/threads.h"

namespace {

using titan::Trans;

struct GemmShape {
  const char* what;
  Trans trans_a, trans_b;
  int64_t m, n, k;
};

template <typename Fn>
double best_gflops(const GemmShape& s, Fn&& run) {
  run();  // warm-up (and, for bf16, the primitive's creation)
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = titan::bench::now_seconds();
    run();
    best = std::min(best, titan::bench::now_seconds() - t0);
  }
  return 2.0 * s.m * s.n * s.k / best * 1e-9;
}

int run(int argc, char** argv) {
  titan::set_thread_count(argc > 1 ? std::atoi(argv[1]) : titan::default_thread_count());
  const Trans N = Trans::no, T = Trans::yes;
  const GemmShape shapes[] = {
      {"square 2048", N, N, 2048, 2048, 2048},       {"q_proj fwd  x W^T", N, T, 2048, 1024, 512},
      {"gate fwd    x W^T", N, T, 2048, 2048, 512},  {"down fwd    x W^T", N, T, 2048, 512, 2048},
      {"gate dX     dY W", N, N, 2048, 512, 2048},   {"gate dW     dY^T X", T, N, 2048, 512, 2048},
      {"lm_head fwd chunk", N, T, 256, 151936, 512}, {"attn QK^T   64x64x128", N, T, 64, 64, 128},
  };
  titan::Backend& be = titan::backend();
  std::printf("%s\n%-24s %12s %12s %12s\n", be.name().c_str(), "shape (m x n x k)", "sgemm GF/s",
              "be f32 GF/s", "be bf16 GF/s");
  for (const GemmShape& s : shapes) {
    const int64_t lda = s.trans_a == N ? s.k : s.m, ldb = s.trans_b == N ? s.n : s.k;
    const size_t a_size = size_t(s.m * s.k), b_size = size_t(s.k * s.n);
    std::vector<float> a(a_size, 0.01f), b(b_size, 0.02f), c(size_t(s.m * s.n));
    std::vector<uint16_t> a16(a_size, titan::f32_to_bf16(0.01f)),
        b16(b_size, titan::f32_to_bf16(0.02f));
    const double direct = best_gflops(s, [&] {
      titan::gemm_f32(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                      c.data(), s.n);
    });
    const double f32 = best_gflops(s, [&] {
      be.gemm_f32(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, 0.0f,
                  c.data(), s.n);
    });
    const double bf16 = best_gflops(s, [&] {
      be.gemm_bf16(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a16.data(), lda, b16.data(), ldb,
                   0.0f, c.data(), s.n);
    });
    std::printf("%-24s %12.1f %12.1f %12.1f\n", s.what, direct, f32, bf16);
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return titan::bench::run_main("bench_gemm_backend", run, argc, argv);
}
