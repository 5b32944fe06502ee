// Whole arrays rounded to bf16 or widened back, split over the backend's threads: mixed
// precision's GEMM operands (a linear's input and output gradient), the activations it keeps in
// bf16, and the bf16 copies of fp32 master weights. Inside an op's own parallel loop, a row at a
// time, the ops call the VecKernels primitives these split (round_to_bf16, widen_bf16) directly.
// File conversions between dtypes (any alignment, F16 too) are io/convert.h's.
#pragma once

#include <cstdint>

namespace titan {

// dst (n) = x (n) rounded to bf16, raw bits (f32_to_bf16's rounding).
void round_to_bf16(uint16_t* dst, const float* x, int64_t n);
// One array's rounding: dst (n) = src (n) rounded to bf16 (a master weight's bf16 copy), what
// DeviceOps::round_to_bf16_all takes for every copy of a unit at once.
struct Bf16Cast {
  uint16_t* dst = nullptr;
  const float* src = nullptr;
  int64_t n = 0;
};

// dst (n) = x (n, raw bf16 bits) widened to fp32.
void widen_bf16(float* dst, const uint16_t* x, int64_t n);
// values (n) rounded to bf16 in place (each the fp32 holding its bf16 value); bits (n), unless
// null, receives their raw bf16 bits: a value kept for a backward in both forms.
void round_to_bf16_keeping(float* values, uint16_t* bits, int64_t n);

}  // namespace titan
