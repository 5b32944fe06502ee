// Bodies of the step-wide CUDA kernels (step_arrays.cu), which take every parameter array of a
// step at once through a table of arrays and their flat starts: the gradient norm's sum of squares
// (one thread's strided share of one array), AdamW with clipping's scale and the bf16 casts of a
// unit's weight copies (one element of the arrays laid end to end). __host__ __device__, so
// tests/unit/test_cuda_rows.cpp runs them on the host against the CPU's ops.
#pragma once

#include <cstdint>

#include "titan/ops/adamw.h"
#include "titan/ops/bf16_arrays.h"
#include "titan/ops/cuda/elementwise_rows.h"
#include "titan/ops/cuda/hd.h"

namespace titan::cuda_rows {

// The array holding flat element i (0 <= i < starts[count]) of `count` arrays laid end to end:
// the last j with starts[j] <= i. starts (count + 1) ascends from 0; an empty array's start equals
// the next one's, so the last such j is never an empty array.
TITAN_HD inline int64_t array_of(const int64_t* starts, int64_t count, int64_t i) {
  int64_t lo = 0, hi = count - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (starts[mid] <= i) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// A gradient times clipping's coefficient, rounded once as DeviceOps::scale stores it: on the
// device __fmul_rn, which nvcc never contracts into the AdamW arithmetic that reads the product.
TITAN_HD inline float scaled_grad(float grad, float scale) {
#ifdef __CUDA_ARCH__
  return __fmul_rn(grad, scale);
#else
  return grad * scale;
#endif
}

// AdamW on flat element i of the arrays (table (count), starts (count + 1)), its gradient scaled
// by grad_scale first; the gradient itself is left as it was.
TITAN_HD inline void adamw_all_element(const AdamWArrays* table, const int64_t* starts,
                                       int64_t count, int64_t i, const AdamWScalars& s,
                                       float grad_scale) {
  const int64_t j = array_of(starts, count, i);
  const AdamWArrays& a = table[j];
  const int64_t e = i - starts[j];
  adamw_element(a.param + e, scaled_grad(a.grad[e], grad_scale), a.exp_avg + e, a.exp_avg_sq + e,
                s);
}

// round_to_bf16 of flat element i of the casts (table (count), starts (count + 1)).
TITAN_HD inline void round_all_element(const Bf16Cast* table, const int64_t* starts, int64_t count,
                                       int64_t i) {
  const int64_t j = array_of(starts, count, i);
  const int64_t e = i - starts[j];
  table[j].dst[e] = to_bf16(table[j].src[e]);
}

// One thread's fp64 share of sum x[i]^2 over x (n): elements first, first + stride, ...
// (arrays.cu's sum_squares_kernel's loop: a block's threads' shares summed by the block team).
TITAN_HD inline double sum_squares_share(const float* x, int64_t n, int64_t first, int64_t stride) {
  double part = 0.0;
  for (int64_t i = first; i < n; i += stride) part += static_cast<double>(x[i]) * x[i];
  return part;
}

}  // namespace titan::cuda_rows
