// GEMM throughput on the shapes a `small` training step (h 512, I 2048, 4 x 512 tokens, vocabulary
// 151,936 in 512-row chunks), a Qwen3-0.6B prefill and a MoE expert use, for docs/GEMM.md. fp32 two
// ways, oneDNN's sgemm and its matmul primitive, then gemm_f32 through backend() -- the route it
// chooses per transpose pair, whose rate must be the better of the two and the interface must
// cost nothing -- and bf16 operands with fp32 accumulation through backend() (oneDNN's matmul).
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
  float beta;  // 1 where the step accumulates (weight gradients, a second dX)
};

template <typename Fn>
double best_gflops(const GemmShape& s, Fn&& run) {
  run();  // warm-up (and, for the matmul, the primitive's creation)
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
      {"square 2048", N, N, 2048, 2048, 2048, 0},
      {"q_proj fwd   x W^T", N, T, 2048, 1024, 512, 0},
      {"o_proj fwd   x W^T", N, T, 2048, 512, 1024, 0},
      {"gate fwd     x W^T", N, T, 2048, 2048, 512, 0},
      {"down fwd     x W^T", N, T, 2048, 512, 2048, 0},
      {"gate dX      dY W", N, N, 2048, 512, 2048, 0},
      {"up dX        dY W +", N, N, 2048, 512, 2048, 1},
      {"gate dW      dY^T X +", T, N, 2048, 512, 2048, 1},
      {"down dW      dY^T X +", T, N, 512, 2048, 2048, 1},
      {"lm_head fwd  chunk", N, T, 512, 151936, 512, 0},
      {"lm_head dX   chunk", N, N, 512, 512, 151936, 0},
      {"lm_head dW   chunk +", T, N, 151936, 512, 512, 1},
      {"0.6B q       128 rows", N, T, 128, 2048, 1024, 0},
      {"0.6B gate    128 rows", N, T, 128, 3072, 1024, 0},
      {"0.6B down    128 rows", N, T, 128, 1024, 3072, 0},
      {"0.6B gate    512 rows", N, T, 512, 3072, 1024, 0},
      {"0.6B down    512 rows", N, T, 512, 1024, 3072, 0},
      {"expert gate  40 rows", N, T, 40, 768, 2048, 0},
      {"expert dX    40 rows", N, N, 40, 2048, 768, 0},
      {"expert dW    40 rows +", T, N, 768, 2048, 40, 1},
  };
  titan::Backend& be = titan::backend();
  std::printf("%s\n%-24s %6s %6s %6s  %9s %9s %9s %9s\n", be.name().c_str(), "shape (+: beta 1)",
              "m", "n", "k", "sgemm", "matmul", "be f32", "be bf16");
  for (const GemmShape& s : shapes) {
    const int64_t lda = s.trans_a == N ? s.k : s.m, ldb = s.trans_b == N ? s.n : s.k;
    const size_t a_size = size_t(s.m * s.k), b_size = size_t(s.k * s.n);
    std::vector<float> a(a_size, 0.01f), b(b_size, 0.02f), c(size_t(s.m * s.n));
    std::vector<uint16_t> a16(a_size, titan::f32_to_bf16(0.01f)),
        b16(b_size, titan::f32_to_bf16(0.02f));
    const double sgemm = best_gflops(s, [&] {
      titan::sgemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, s.beta,
                   c.data(), s.n);
    });
    const double matmul = best_gflops(s, [&] {
      titan::matmul_f32(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb,
                        s.beta, c.data(), s.n);
    });
    const double f32 = best_gflops(s, [&] {
      be.gemm_f32(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a.data(), lda, b.data(), ldb, s.beta,
                  c.data(), s.n);
    });
    const double bf16 = best_gflops(s, [&] {
      be.gemm_bf16(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a16.data(), lda, b16.data(), ldb,
                   s.beta, c.data(), s.n);
    });
    std::printf("%-24s %6lld %6lld %6lld  %9.1f %9.1f %9.1f %9.1f\n", s.what,
                static_cast<long long>(s.m), static_cast<long long>(s.n),
                static_cast<long long>(s.k), sgemm, matmul, f32, bf16);
  }
  std::printf("(GFLOP/s, best of 5 after a warm-up)\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return titan::bench::run_main("bench_gemm_backend", run, argc, argv);
}
