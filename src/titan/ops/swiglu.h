// SwiGLU's elementwise half: out = silu(gate) * up (the projections are linears).
#pragma once

#include <cstdint>

namespace titan {

// out, gate, up: (N, I) flattened to n elements.
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n);

void swiglu_forward_reference(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward_reference(float* dgate, float* dup, const float* dout, const float* gate,
                               const float* up, int64_t n);

}  // namespace titan
