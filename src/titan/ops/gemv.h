// Matrix-vector products for one-token decode. A decode step reads every weight once and does two
// FLOPs per weight, so it is bound by memory bandwidth, not by the GEMM ceiling: the weights are
// streamed row by row, fp32 or bf16 (widened to fp32 in registers; half the bytes), with fp32
// accumulation. A bf16 weight multiplies x rounded to bf16, as the bf16 GEMMs take their operands
// (ops/linear.h), so one token's products equal a prompt's up to summation order.
#pragma once

#include <cstdint>
#include <span>

#include "titan/core/dtype.h"

namespace titan {

// A (rows, cols) row-major weight matrix, as nn.Linear's (out, in) weight.
struct GemvWeight {
  DType dtype = DType::f32;    // f32 or bf16
  const void* data = nullptr;  // (rows, cols)
  int64_t rows = 0, cols = 0;
};

// y (w.rows) = W x
struct GemvProduct {
  GemvWeight w;
  float* y = nullptr;
};

constexpr size_t kMaxGemvProducts = 4;

// Every product of the list over the same x (cols), in one parallel region: the rows of all of
// them are cut into blocks (64 KiB to 1 MiB of weights, about four per thread) that threads take
// dynamically, so fusing q/k/v (or gate/up) costs one fork/join, and a thread the OS deschedules
// on a shared machine holds back one block, not its static share. Every weight must have the same
// cols; dtypes may differ; at most kMaxGemvProducts.
void gemv_forward(std::span<const GemvProduct> products, const float* x);

// The same contract (x rounded to bf16 for the bf16 weights), one row at a time with fp64
// accumulation (tests).
void gemv_forward_reference(std::span<const GemvProduct> products, const float* x);

}  // namespace titan
