// The CPU's row-major GEMMs, which the CPU backend (cpu_backend.h) exposes to the ops:
//   C[m,n] = alpha * op(A)[m,k] * op(B)[k,n] + beta * C[m,n]
// op(X) is X or X^T. Backed by oneDNN (choice and measurements: docs/GEMM.md).
#pragma once

#include <cstdint>
#include <string>

#include "titan/backend/backend.h"

namespace titan {

// fp32: x W^T (A as stored, B transposed: every linear's forward) through oneDNN's matmul
// primitive (brgemm), which at a prefill's 128-512 rows runs 1.2-2x faster than its sgemm; the
// other transpose pairs through oneDNN's sgemm, which is level or faster there. Inside an OpenMP
// parallel region either runs on the calling thread. Measurements: docs/GEMM.md.
void gemm_f32(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
              const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
              int64_t ldc);

// gemm_f32's two routes: oneDNN's sgemm (BLAS-like C API; threaded, or on the calling thread
// inside a parallel region) and its matmul primitive with fp32 operands. sgemm is also the CPU's
// Backend::gemm_f32_block, since it has no per-call setup (the matmul builds a descriptor, 10-20
// us, about a 64 x 64 x 128 block's own time). bench_gemm_backend calls both on every pair, which
// is how gemm_f32's choice was made.
void sgemm(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);
void matmul_f32(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                int64_t ldc);

// bf16 A and B (raw bits), fp32 accumulation and C: oneDNN's matmul primitive (brgemm with
// AVX512_BF16 or AMX where the CPU has them). Each call builds the primitive's descriptor (10-20
// us), so it suits whole-matrix GEMMs, not attention's per-block ones.
void gemm_bf16(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, float beta, float* c,
               int64_t ldc);

// The same with C written in bf16, each element rounded once (to nearest even) from its fp32
// sum, and no beta: the lm_head's logits under mixed precision, which only a bf16 GEMM and a
// row-by-row softmax read.
void gemm_bf16_to_bf16(Trans trans_a, Trans trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const uint16_t* a, int64_t lda, const uint16_t* b, int64_t ldb, uint16_t* c,
                       int64_t ldc);

// The oneDNN implementation gemm_f32's x W^T and gemm_bf16 dispatch to on this CPU
// ("brg:avx512_core_bf16"; a "ref" one would mean no kernel for the dtype, orders slower).
std::string gemm_library_name();
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
