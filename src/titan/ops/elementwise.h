// Whole-array arithmetic the layers above call between kernels: residual adds, FSDP's gradient
// sums, gradient clipping and norms (and LoRA's transpose of B, a copy). Threaded over
// backend().threads() in chunks, each chunk through the backend's vector primitives, so every
// element gets the same single rounding as a one-thread loop would give it.
#pragma once

#include <cstdint>

namespace titan {

// y (n) += x (n).
void add_into(float* y, const float* x, int64_t n);
// x (n) *= a.
void scale_in_place(float* x, float a, int64_t n);
// sum_i x[i]^2 (n), the squares and their sum in fp64.
double sum_squares_f64(const float* x, int64_t n);
// The index of the first NaN or infinity of x (n), or -1 when every element is finite.
int64_t find_nonfinite(const float* x, int64_t n);
// dst (cols, rows) = src (rows, cols) transposed: exact, a copy. dst is not src.
void transpose(float* dst, const float* src, int64_t rows, int64_t cols);

}  // namespace titan
