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
  float* u = room(scratch->low, 2 * n * rank);       // (N, rank) x A^T
  float* t = room(scratch->wide, n * out_features);  // (N, out) u B^T
  kernel.forward(u, x, a, n, in_features, rank);
  kernel.forward(t, u, b, n, rank, out_features);
  // PEFT: base(x) + lora_B(lora_A(x)) * scaling -- scaled after B, as here.
  device_ops().scale(t, scaling, n * out_features);
  device_ops().add(y, t, n * out_features);
}

void LoraLinear::backward(float* dx, const float* dy, const float* x, int64_t n,
                          const LinearKernel& kernel) const {
  TITAN_CHECK(x != nullptr && dy != nullptr, name,
              ": LoRA's backward needs the linear's input and output gradient in fp32");
  TITAN_CHECK(a_grad != nullptr && b_grad != nullptr, name, ": LoRA gradients not allocated");
  float* low = room(scratch->low, 2 * n * rank);
  float* u = low;              // (N, rank) x A^T
  float* du = low + n * rank;  // (N, rank) scaling * dy B
  float* dy_scaled = room(scratch->wide, n * out_features);
  kernel.forward(u, x, a, n, in_features, rank);
  std::copy(dy, dy + n * out_features, dy_scaled);
  device_ops().scale(dy_scaled, scaling, n * out_features);
  // du = (scaling dy) B, dB += (scaling dy)^T u; then dx += du A, dA += du^T x.
  kernel.backward(du, b_grad, dy_scaled, u, b, n, rank, out_features, false);
  kernel.backward(dx, a_grad, du, x, a, n, in_features, rank, true);
}

}  // namespace titan
