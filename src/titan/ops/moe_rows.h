// What the MoE kernels share (ops/moe.cpp's fused experts, ops/moe_dispatch.cpp's and
// ops/moe_experts.cpp's stages): the grouping of routed rows by expert, the gathers and sums
// between token order and row order, the per-expert loop, and the references' scalar helpers.
// Internal to ops/: one definition, so the stages compute what the fused kernel computes, bit for
// bit.
#pragma once

#include <omp.h>

#include <cstring>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/ops/moe.h"

namespace titan::moe_rows {

// The slot of token t's top-k holding the smallest expert id above `after` (ids within one
// token's top-k are distinct): visiting slots this way sums in ascending expert order.
inline int64_t next_slot_by_expert(const int32_t* index_t, int64_t top_k, int32_t after) {
  int64_t best = -1;
  for (int64_t j = 0; j < top_k; ++j) {
    if (index_t[j] > after && (best < 0 || index_t[j] < index_t[best])) best = j;
  }
  return best;
}

// Expert e's rows are [offsets[e], offsets[e+1]); within an expert, tokens keep their order.
inline void group_rows_by_expert(int32_t* row_of, int32_t* offsets, const int32_t* index,
                                 const ExpertsShape& shape) {
  const int64_t E = shape.n_experts, rows = shape.rows();
  std::vector<int32_t> next(static_cast<size_t>(E) + 1, 0);
  for (int64_t p = 0; p < rows; ++p) {
    TITAN_CHECK(index[p] >= 0 && index[p] < E, "experts: token ", p / shape.top_k,
                " is routed to expert ", index[p], ", outside [0, ", E, ")");
    ++next[index[p] + 1];
  }
  for (int64_t e = 0; e < E; ++e) next[e + 1] += next[e];
  std::memcpy(offsets, next.data(), next.size() * sizeof(int32_t));
  for (int64_t p = 0; p < rows; ++p) row_of[p] = next[index[p]]++;
}

// Rows of `dst` (rows, dim) = the owning token's row of src (N, dim).
inline void gather_token_rows(float* dst, const float* src, const int32_t* row_of,
                              const ExpertsShape& shape, int64_t dim) {
  const int64_t k = shape.top_k;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < shape.rows(); ++p) {
    std::memcpy(dst + static_cast<int64_t>(row_of[p]) * dim, src + (p / k) * dim,
                static_cast<size_t>(dim) * sizeof(float));
  }
}

// gather_token_rows with the rows rounded to bf16 on the way.
inline void gather_token_rows_bf16(uint16_t* dst, const float* src, const int32_t* row_of,
                                   const ExpertsShape& shape, int64_t dim) {
  const int64_t k = shape.top_k;
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < shape.rows(); ++p) {
    v.round_to_bf16(dst + static_cast<int64_t>(row_of[p]) * dim, src + (p / k) * dim, 1.0f, dim);
  }
}

// y (N, h): each token's weighted expert outputs (rows of expert_out), summed in ascending expert
// order as Transformers' index_add_ loop.
inline void sum_weighted_expert_rows(float* y, const float* expert_out, const int32_t* row_of,
                                     const int32_t* index, const float* weight,
                                     const ExpertsShape& shape) {
  const int64_t h = shape.hidden, k = shape.top_k;
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < shape.n_tokens; ++t) {
    float* yt = y + t * h;
    std::memset(yt, 0, static_cast<size_t>(h) * sizeof(float));
    int32_t last = -1;
    for (int64_t step = 0; step < k; ++step) {
      const int64_t j = next_slot_by_expert(index + t * k, k, last);
      last = index[t * k + j];
      v.axpy(yt, weight[t * k + j], expert_out + static_cast<int64_t>(row_of[t * k + j]) * h, h);
    }
  }
}

// dx (N, h): the sum of each token's k rows of dx_rows, in slot order.
inline void sum_token_rows(float* dx, const float* dx_rows, const int32_t* row_of,
                           const ExpertsShape& shape) {
  const int64_t h = shape.hidden, k = shape.top_k;
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < shape.n_tokens; ++t) {
    float* dxt = dx + t * h;
    std::memset(dxt, 0, static_cast<size_t>(h) * sizeof(float));
    for (int64_t j = 0; j < k; ++j) {
      v.axpy(dxt, 1.0f, dx_rows + static_cast<int64_t>(row_of[t * k + j]) * h, h);
    }
  }
}

// fn(e, first_row, n_rows) for every expert that has rows. With at least two experts per thread,
// the experts are spread over the threads, each GEMM on its calling thread (bench_experts, 2
// threads, 64 experts of 64 rows: forward 35% -> 67% of the GEMM ceiling; 8 experts of 512 rows
// no worse); with fewer, one expert at a time and each GEMM threaded inside oneDNN, so no thread
// idles.
template <typename Fn>
inline void for_each_expert(const int32_t* offsets, int64_t n_experts, const Fn& fn) {
  const auto one = [&](int64_t e) {
    const int64_t r0 = offsets[e], n_e = offsets[e + 1] - r0;
    if (n_e > 0) fn(e, r0, n_e);
  };
  if (n_experts < 2 * static_cast<int64_t>(omp_get_max_threads())) {
    for (int64_t e = 0; e < n_experts; ++e) one(e);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int64_t e = 0; e < n_experts; ++e) one(e);
}

// For the bf16 references: a bf16 value, and an fp32 value rounded to bf16, both exact in fp64.
inline double widen(uint16_t bf16) {
  return bf16_to_f32(bf16);
}
inline double round_bf16(float value) {
  return bf16_to_f32(f32_to_bf16(value));
}

}  // namespace titan::moe_rows
