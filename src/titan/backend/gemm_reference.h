// The naive fp32 GEMM every backend's GEMMs are tested against (tests/unit/backend_checks.h), and
// the reference kernels of the ops build on: three loops, fp64 accumulation, host memory.
// Row-major C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n], op(X) = X or X^T.
#pragma once

#include <cstdint>

#include "titan/backend/backend.h"

namespace titan {

void gemm_f32_reference(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                        const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                        float* c, int64_t ldc);

}  // namespace titan
