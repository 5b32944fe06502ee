#include <dnnl.h>

#include "titan/backend/cpu/gemm.h"
#include "titan/core/error.h"

namespace titan {

void sgemm(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
  if (m == 0 || n == 0) return;
  const dnnl_status_t status = dnnl_sgemm(static_cast<char>(trans_a), static_cast<char>(trans_b), m,
                                          n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  TITAN_CHECK(status == dnnl_success, "oneDNN sgemm failed (status ", static_cast<int>(status),
              ") for m=", m, " n=", n, " k=", k, " lda=", lda, " ldb=", ldb, " ldc=", ldc);
}

}  // namespace titan
