// The CPU's row-major GEMMs, which the CPU backend (cpu_backend.h) exposes to the ops:
//   C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n]
// op(X) is X or X^T. Backed by oneDNN (choice and measurements: docs/GEMM.md).
#pragma once

#include <cstdint>
#include <string>

#include "titan/backend/backend.h"

namespace titan {

// fp32: oneDNN's sgemm. Called inside an OpenMP parallel region it runs on the calling thread.
void gemm_f32(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc);

// bf16 A and B (raw bits), fp32 accumulation and C: oneDNN's matmul primitive (brgemm with
// AVX512_BF16 or AMX where the CPU has them). Each call builds the primitive's descriptor (10-20
// us), so it suits whole-matrix GEMMs, not attention's per-block ones.
void gemm_bf16(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

std::string gemm_library_name();
// The oneDNN implementation gemm_bf16 dispatches to on this CPU ("brg:avx512_core_bf16"; a
// "ref" one would mean no bf16 kernel, orders of magnitude slower).
std::string gemm_bf16_library_name();

}  // namespace titan

namespace titan {

// The fp32 GEMM ceiling of this machine with the current thread count, in GFLOP/s: the best of
// seven square 2048^3 GEMMs after a warm-up (about half a second on 2 cores). The benchmarks
// report against it; MFU is against the hardware's peak (peak.h), which no moment's load moves.
double measure_gemm_ceiling_gflops();
// The same with bf16 operands and fp32 accumulation (gemm_bf16): the mixed-precision ceiling.
double measure_gemm_bf16_ceiling_gflops();

}  // namespace titan
