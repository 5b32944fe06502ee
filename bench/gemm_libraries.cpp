// Measures fp32 GEMM throughput of OpenBLAS and oneDNN on the shapes a Qwen3 training step uses,
// so the choice of GEMM library (docs/GEMM.md) rests on numbers from this machine.
// Usage: bench_gemm_libraries [threads]
#include <cblas.h>
#include <dnnl.h>
#include <omp.h>
#include <algorithm>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "bench_main.h"

namespace {

using titan::bench::now_seconds;

struct GemmShape {
  const char* what;
  char trans_a, trans_b;
  int m, n, k;
};

template <typename Fn>
double best_gflops(const GemmShape& s, Fn&& run) {
  run();  // warm-up
  double best = 1e30;
  for (int rep = 0; rep < 5; ++rep) {
    const double t0 = now_seconds();
    run();
    best = std::min(best, now_seconds() - t0);
  }
  return 2.0 * s.m * s.n * s.k / best * 1e-9;
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = argc > 1 ? std::atoi(argv[1]) : omp_get_max_threads();
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
  // Row-major C[m,n] = op(A) op(B); 'T' on B is the nn.Linear forward (x W^T).
  const GemmShape shapes[] = {
      {"square 2048", 'N', 'N', 2048, 2048, 2048},
      {"q_proj fwd  x W^T", 'N', 'T', 2048, 1024, 512},
      {"gate fwd    x W^T", 'N', 'T', 2048, 2048, 512},
      {"down fwd    x W^T", 'N', 'T', 2048, 512, 2048},
      {"gate dX     dY W", 'N', 'N', 2048, 512, 2048},
      {"gate dW     dY^T X", 'T', 'N', 2048, 512, 2048},
      {"lm_head fwd chunk", 'N', 'T', 256, 151936, 512},
      {"lm_head dW  chunk", 'T', 'N', 151936, 512, 256},
      {"attn QK^T   64x64x128", 'N', 'T', 64, 64, 128},
  };
  std::printf("threads %d\n%-24s %14s %14s\n", threads, "shape (m x n x k)", "OpenBLAS GF/s",
              "oneDNN GF/s");
  for (const GemmShape& s : shapes) {
    const int rows_a = s.trans_a == 'N' ? s.m : s.k, cols_a = s.trans_a == 'N' ? s.k : s.m;
    const int rows_b = s.trans_b == 'N' ? s.k : s.n, cols_b = s.trans_b == 'N' ? s.n : s.k;
    std::vector<float> a(size_t(rows_a) * cols_a, 0.01f), b(size_t(rows_b) * cols_b, 0.02f),
        c(size_t(s.m) * s.n);
    const double blas = best_gflops(s, [&] {
      cblas_sgemm(CblasRowMajor, s.trans_a == 'N' ? CblasNoTrans : CblasTrans,
                  s.trans_b == 'N' ? CblasNoTrans : CblasTrans, s.m, s.n, s.k, 1.0f, a.data(),
                  cols_a, b.data(), cols_b, 0.0f, c.data(), s.n);
    });
    const double dnnl = best_gflops(s, [&] {
      dnnl_sgemm(s.trans_a, s.trans_b, s.m, s.n, s.k, 1.0f, a.data(), cols_a, b.data(), cols_b,
                 0.0f, c.data(), s.n);
    });
    std::printf("%-24s %14.1f %14.1f\n", s.what, blas, dnnl);
  }
  return 0;
}
