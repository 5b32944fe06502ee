// One routed row of the reference experts, sums in fp64: what the token-major references
// (ops/moe.cpp, a token's k rows in turn) and the grouped-row references (ops/moe_experts.cpp,
// each expert's rows in turn) both compute for a row r of expert e, written once so the two
// agree by construction. Internal to ops/.
#pragma once

#include <cstdint>

#include "titan/ops/moe.h"

namespace titan::moe_reference {

// fp32. Writes row r of act.gate, act.up and act.act (Im each) from x_row (h), and out (h) = the
// expert's output, unrounded.
void row_forward(double* out, const ExpertsActivations& act, const float* x_row, int64_t e,
                 int64_t r, const ExpertWeights& w, const ExpertsShape& shape);
// Recomputes act from act.gate and act.up; adds the row's d x to dx_sum (h), accumulates the
// non-null expert gradients in dw, and returns d loss / d weight. dy_row (h) is the token's d y,
// weight the row's routing weight.
float row_backward(double* dx_sum, const ExpertGrads& dw, const float* dy_row, float weight,
                   const ExpertsActivations& act, const float* x_row, int64_t e, int64_t r,
                   const ExpertWeights& w, const ExpertsShape& shape);

// bf16 operands (ops/moe.h's contract), x_row (h) already rounded to bf16: act's rows r hold
// bf16 gate, up and act; out (h) is down_proj's fp64 sum, before its fp32 rounding.
void row_forward_bf16(double* out, const ExpertsActivations& act, const double* x_row, int64_t e,
                      int64_t r, const ExpertWeightsBf16& w, const ExpertsShape& shape);
float row_backward_bf16(double* dx_sum, const ExpertGrads& dw, const float* dy_row, float weight,
                        const ExpertsActivations& act, const double* x_row, int64_t e, int64_t r,
                        const ExpertWeightsBf16& w, const ExpertsShape& shape);

}  // namespace titan::moe_reference
