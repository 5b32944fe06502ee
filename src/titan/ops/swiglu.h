// SwiGLU's elementwise half: out = silu(gate) * up (the projections are linears).
#pragma once

#include <cstdint>

namespace titan {

// out, gate, up: (N, I) flattened to n elements.
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n);

// Mixed precision, where gate and up come from bf16 GEMMs (autocast returns them in bf16) and the
// product feeds one: act (n, raw bf16 bits) = bf16(silu(bf16(gate)) * bf16(up)), the product in
// fp32 as swiglu_forward computes it, in one pass; the roundings of gate and up are kept
// (gate_kept, up_kept: raw bits) for the backward, unless null.
void swiglu_forward_bf16(uint16_t* act, uint16_t* gate_kept, uint16_t* up_kept, const float* gate,
                         const float* up, int64_t n);
// The act swiglu_forward_bf16 wrote, bit for bit, from the gate and up it kept: the backward
// recomputes it rather than keep it.
void swiglu_recompute_bf16(uint16_t* act, const uint16_t* gate, const uint16_t* up, int64_t n);
// swiglu_backward over the kept gate and up, widened a chunk at a time; d gate and d up come out
// rounded to bf16 (raw bits), as the bf16 GEMMs of gate_proj's and up_proj's backward read them.
void swiglu_backward_bf16(uint16_t* dgate, uint16_t* dup, const float* dout, const uint16_t* gate,
                          const uint16_t* up, int64_t n);

void swiglu_forward_reference(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward_reference(float* dgate, float* dup, const float* dout, const float* gate,
                               const float* up, int64_t n);

}  // namespace titan
