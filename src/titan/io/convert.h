// Bulk element-type conversion at the checkpoint edge (load into fp32, export to bf16/f16/f32),
// threaded over chunks. Rounding is round-to-nearest-even, as torch's .to(dtype) does.
#pragma once

#include <cstddef>

#include "titan/core/dtype.h"

namespace titan {

// dst[i] = float(src[i]) for i < n; `src_dtype` is f32, bf16 or f16 (else titan::Error), `src`
// may be unaligned (tensors in an unpadded safetensors file).
void convert_to_f32(const void* src, DType src_dtype, size_t n, float* dst);
// dst[i] = dst_dtype(src[i]) for i < n; `dst_dtype` is f32, bf16 or f16 (else titan::Error).
void convert_from_f32(const float* src, size_t n, DType dst_dtype, void* dst);
// Between any two of f32, bf16, f16 (through fp32 when neither side is f32).
void convert_float(const void* src, DType src_dtype, size_t n, void* dst, DType dst_dtype);
// How many of the n values at `data` (f32, bf16 or f16, maybe unaligned) are NaN or infinite.
size_t count_nonfinite(const void* data, DType dtype, size_t n);

}  // namespace titan
