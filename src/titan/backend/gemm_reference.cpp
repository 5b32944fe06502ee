// Its own file so the CUDA smoke test links it without libtitan.
#include "titan/backend/gemm_reference.h"

namespace titan {

void gemm_f32_reference(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                        float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const float av = trans_a == Trans::no ? a[i * lda + p] : a[p * lda + i];
        const float bv = trans_b == Trans::no ? b[p * ldb + j] : b[j * ldb + p];
        acc += static_cast<double>(av) * bv;
      }
      const float prior = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
      c[i * ldc + j] = static_cast<float>(alpha * acc) + prior;
    }
  }
}

}  // namespace titan
