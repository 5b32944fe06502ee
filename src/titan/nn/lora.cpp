#include "titan/nn/lora.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/dispatch/device_ops.h"

namespace titan {
namespace {

float* room(std::vector<float>& v, int64_t floats) {
  if (static_cast<int64_t>(v.size()) < floats) v.resize(static_cast<size_t>(floats));
  return v.data();
}

}  // namespace

void LoraLinear::forward_add(float* y, const float* x, int64_t n,
                             const LinearKernel& kernel) const {
  TITAN_CHECK(x != nullptr, name, ": LoRA needs the linear's input in fp32");
  float* u = room(scratch->low, 2 * n * rank);           // (N, rank) scaling * x A^T
  float* b_t = room(scratch->b_t, rank * out_features);  // (rank, out) B^T
  kernel.forward(u, x, a, n, in_features, rank);
  device_ops().scale(u, scaling, n * rank);
  for (int64_t o = 0; o < out_features; ++o) {
    for (int64_t r = 0; r < rank; ++r) b_t[r * out_features + o] = b[o * rank + r];
  }
  // y += u B: the kernel's input-gradient product (dx += dy W, no weight gradient) with W = B^T,
  // so the update is added in the GEMM, without an (N, out) temporary. Scaling the rank-wide u
  // rather than the product, as PEFT does, differs from it only in rounding.
  kernel.backward(y, nullptr, u, nullptr, b_t, n, out_features, rank, true);
}

void LoraLinear::backward(float* dx, const float* dy, const float* x, int64_t n,
                          const LinearKernel& kernel) const {
  TITAN_CHECK(x != nullptr && dy != nullptr, name,
              ": LoRA's backward needs the linear's input and output gradient in fp32");
  TITAN_CHECK(a_grad != nullptr && b_grad != nullptr, name, ": LoRA gradients not allocated");
  float* low = room(scratch->low, 2 * n * rank);
  float* u = low;              // (N, rank) scaling * x A^T
  float* du = low + n * rank;  // (N, rank) scaling * dy B
  kernel.forward(u, x, a, n, in_features, rank);
  device_ops().scale(u, scaling, n * rank);
  // du = dy B, dB += dy^T u (u carries the scaling); then du *= scaling, dx += du A,
  // dA += du^T x.
  kernel.backward(du, b_grad, dy, u, b, n, rank, out_features, false);
  device_ops().scale(du, scaling, n * rank);
  kernel.backward(dx, a_grad, du, x, a, n, in_features, rank, true);
}

}  // namespace titan
