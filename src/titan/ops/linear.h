// nn.Linear without bias: y = x W^T, W (out, in) as in Hugging Face checkpoints. In fp32, and
// with bf16 operands (raw bits) and fp32 accumulation and outputs, as mixed precision computes it.
#pragma once

#include <cstdint>

namespace titan {

// y (N, out) = x (N, in) W^T
void linear_forward(float* y, const float* x, const float* weight, int64_t n_rows,
                    int64_t in_features, int64_t out_features);
// dx (N, in) = dy W (overwritten, or added to when accumulate_dx); dweight (out, in) += dy^T x,
// or null: no weight gradient (a frozen weight: LoRA's base), and x is then not read (may be null:
// LoRA adds its update through this dx product, nn/lora.h).
void linear_backward(float* dx, float* dweight, const float* dy, const float* x,
                     const float* weight, int64_t n_rows, int64_t in_features, int64_t out_features,
                     bool accumulate_dx);

// The same with bf16 x, W and dy: y, dx and dweight are fp32, so gradients accumulate in fp32.
void linear_forward_bf16(float* y, const uint16_t* x, const uint16_t* weight, int64_t n_rows,
                         int64_t in_features, int64_t out_features);
void linear_backward_bf16(float* dx, float* dweight, const uint16_t* dy, const uint16_t* x,
                          const uint16_t* weight, int64_t n_rows, int64_t in_features,
                          int64_t out_features, bool accumulate_dx);
// The bf16 forward with y rounded to bf16 (raw bits) from its fp32 accumulation, as autocast's
// bf16 matmuls return it: for outputs kept only rounded, it saves writing fp32 and rounding it.
void linear_forward_bf16_to_bf16(uint16_t* y, const uint16_t* x, const uint16_t* weight,
                                 int64_t n_rows, int64_t in_features, int64_t out_features);

// The same contracts on gemm_f32_reference (bf16 operands widened exactly to fp32 first).
void linear_forward_reference(float* y, const float* x, const float* weight, int64_t n_rows,
                              int64_t in_features, int64_t out_features);
void linear_backward_reference(float* dx, float* dweight, const float* dy, const float* x,
                               const float* weight, int64_t n_rows, int64_t in_features,
                               int64_t out_features, bool accumulate_dx);
void linear_forward_bf16_reference(float* y, const uint16_t* x, const uint16_t* weight,
                                   int64_t n_rows, int64_t in_features, int64_t out_features);
void linear_backward_bf16_reference(float* dx, float* dweight, const uint16_t* dy,
                                    const uint16_t* x, const uint16_t* weight, int64_t n_rows,
                                    int64_t in_features, int64_t out_features, bool accumulate_dx);

}  // namespace titan
