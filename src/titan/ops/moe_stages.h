// A sparse MoE block's experts as stages, each a forward/backward pair beside a plain reference
// (the fused experts of ops/moe.h, split where expert parallel cuts them):
//
//   route     router_topk_forward (ops/moe.h)        logits (N, E) -> index, weight (N, k)
//   dispatch  moe_dispatch_plan + _forward            x (N, h) -> x_rows (R, h), grouped by expert
//   [exchange: expert parallel's all-to-all-v sends rows to the ranks holding their experts]
//   compute   grouped_experts_forward                 x_rows -> out_rows (R, h), unweighted
//   [exchange: and brings the outputs back]
//   combine   moe_combine_forward                     out_rows, weight -> y (N, h)
//
// R = N*k routed (token, slot) pairs, "rows". Expert e owns rows [offsets[e], offsets[e + 1]), its
// tokens in token order; row_of[t*k + j] is (token t, slot j)'s row. On one rank the exchanges are
// the identity and dispatch is a permutation.
//
// The backward runs the stages in reverse with the rows' gradient in factored form: combine's
// backward gives each row its token's dy (unweighted) and routing weight, d out_r = w_r * dy_r, and
// the compute stage's backward applies w_r where the fused kernel does (fp32: to dy down_e, on Im
// values; bf16: to dy before rounding it) and computes d w_r from what only it holds (fp32:
// <dy down_e, act>, bf16: <dy, out_r> over the outputs recomputed), so that the composed stages
// equal experts_forward_grouped / experts_backward_grouped bit for bit; dispatch's backward brings
// dx rows and d w back to token order. Under expert parallel w_r goes to the expert's rank and d
// w_r comes back beside the dx rows, one more value per row.
#pragma once

#include <cstdint>

#include "titan/ops/moe.h"

namespace titan {

// Dispatch. plan: row_of (N*k) and offsets (E + 1) from index (N, k); an index outside [0, E) is a
// titan::Error. forward: x_rows (R, h) = x (N, h) gathered, row row_of[t*k + j] = x[t]; the bf16
// form rounds each row to bf16 (raw bits, the grouped GEMMs' operand) on the way. backward: dx
// (N, h) = the sum of token t's k dx_rows (R, h) in slot order, and dweight (N, k) = dweight_rows
// (R) back in (token, slot) order; both overwritten.
void moe_dispatch_plan(int32_t* row_of, int32_t* offsets, const int32_t* index,
                       const ExpertsShape& shape);
void moe_dispatch_forward(float* x_rows, const float* x, const int32_t* row_of,
                          const ExpertsShape& shape);
void moe_dispatch_forward_bf16(uint16_t* x_rows, const float* x, const int32_t* row_of,
                               const ExpertsShape& shape);
void moe_dispatch_backward(float* dx, float* dweight, const float* dx_rows,
                           const float* dweight_rows, const int32_t* row_of,
                           const ExpertsShape& shape);
// Plain loops: the plan by a stable sort of the rows by expert, the sums in fp64.
void moe_dispatch_plan_reference(int32_t* row_of, int32_t* offsets, const int32_t* index,
                                 const ExpertsShape& shape);
void moe_dispatch_forward_reference(float* x_rows, const float* x, const int32_t* row_of,
                                    const ExpertsShape& shape);
void moe_dispatch_forward_bf16_reference(uint16_t* x_rows, const float* x, const int32_t* row_of,
                                         const ExpertsShape& shape);
void moe_dispatch_backward_reference(float* dx, float* dweight, const float* dx_rows,
                                     const float* dweight_rows, const int32_t* row_of,
                                     const ExpertsShape& shape);

// Grouped compute: out_rows (R, h) = expert e's SwiGLU MLP of each of its x_rows (R, h), not
// weighted; act's gate, up and act (R, Im) as ExpertsActivations says (the bf16 form keeps gate
// and up in bf16, and with s.dgate null keeps nothing, as experts_forward_grouped_bf16); offsets
// (E + 1) as dispatch planned them. The backward takes d out in factored form: rows (R, h) holds
// each row's dy (overwritten: the kernel's scratch, then dx rows out), w_rows (R) its routing
// weight; it writes dweight_rows (R) = d loss / d w_r and accumulates the expert gradients into dw.
// The bf16 backward also needs s.out (R, h). x_rows again: other layers' forwards reused the room.
void grouped_experts_forward(float* out_rows, const ExpertsActivations& act,
                             const ExpertsScratch& s, const float* x_rows, const int32_t* offsets,
                             const ExpertWeights& w, const ExpertsShape& shape);
void grouped_experts_backward(float* rows, float* dweight_rows, const ExpertGrads& dw,
                              const ExpertsScratch& s, const float* w_rows,
                              const ExpertsActivations& act, const float* x_rows,
                              const int32_t* offsets, const ExpertWeights& w,
                              const ExpertsShape& shape);
void grouped_experts_forward_bf16(float* out_rows, const ExpertsActivations& act,
                                  const ExpertsScratch& s, const uint16_t* x_rows,
                                  const int32_t* offsets, const ExpertWeightsBf16& w,
                                  const ExpertsShape& shape);
void grouped_experts_backward_bf16(float* rows, float* dweight_rows, const ExpertGrads& dw,
                                   const ExpertsScratch& s, const float* w_rows,
                                   const ExpertsActivations& act, const uint16_t* x_rows,
                                   const int32_t* offsets, const ExpertWeightsBf16& w,
                                   const ExpertsShape& shape);
// Row by row with fp64 sums (scratch unused; the bf16 forms round what the fast ones round).
void grouped_experts_forward_reference(float* out_rows, const ExpertsActivations& act,
                                       const ExpertsScratch& s, const float* x_rows,
                                       const int32_t* offsets, const ExpertWeights& w,
                                       const ExpertsShape& shape);
void grouped_experts_backward_reference(float* rows, float* dweight_rows, const ExpertGrads& dw,
                                        const ExpertsScratch& s, const float* w_rows,
                                        const ExpertsActivations& act, const float* x_rows,
                                        const int32_t* offsets, const ExpertWeights& w,
                                        const ExpertsShape& shape);
void grouped_experts_forward_bf16_reference(float* out_rows, const ExpertsActivations& act,
                                            const ExpertsScratch& s, const uint16_t* x_rows,
                                            const int32_t* offsets, const ExpertWeightsBf16& w,
                                            const ExpertsShape& shape);
void grouped_experts_backward_bf16_reference(float* rows, float* dweight_rows,
                                             const ExpertGrads& dw, const ExpertsScratch& s,
                                             const float* w_rows, const ExpertsActivations& act,
                                             const uint16_t* x_rows, const int32_t* offsets,
                                             const ExpertWeightsBf16& w, const ExpertsShape& shape);

// Combine: y (N, h) = sum over slots of weight (N, k) times the slot's out_rows (R, h) row, in
// ascending expert order (Transformers' index_add_ loop, and the fused kernel's). backward: the
// factored d out, dy_rows (R, h) = dy (N, h) of each row's token and w_rows (R) = its weight.
// fp32 in both dtypes: the weighted sum is never rounded to bf16.
void moe_combine_forward(float* y, const float* out_rows, const int32_t* row_of,
                         const int32_t* index, const float* weight, const ExpertsShape& shape);
void moe_combine_backward(float* dy_rows, float* w_rows, const float* dy, const float* weight,
                          const int32_t* row_of, const ExpertsShape& shape);
void moe_combine_forward_reference(float* y, const float* out_rows, const int32_t* row_of,
                                   const int32_t* index, const float* weight,
                                   const ExpertsShape& shape);
void moe_combine_backward_reference(float* dy_rows, float* w_rows, const float* dy,
                                    const float* weight, const int32_t* row_of,
                                    const ExpertsShape& shape);

// The four stages composed with the built-in kernels, under the fused kernels' contract (ops/moe.h,
// with s.w_rows, s.dweight_rows and, in bf16, s.out): the registry's `experts_staged`, the
// default experts slot, on which SparseMoeBlock runs its own stage slots instead (nn/layers.h).
void experts_forward_staged(float* y, const ExpertsActivations& act, const ExpertsScratch& s,
                            const float* x, const int32_t* index, const float* weight,
                            const ExpertWeights& w, const ExpertsShape& shape);
void experts_backward_staged(float* dx, float* dweight, const ExpertGrads& dw,
                             const ExpertsScratch& s, const float* dy,
                             const ExpertsActivations& act, const float* x, const int32_t* index,
                             const float* weight, const ExpertWeights& w,
                             const ExpertsShape& shape);
void experts_forward_staged_bf16(float* y, const ExpertsActivations& act, const ExpertsScratch& s,
                                 const float* x, const int32_t* index, const float* weight,
                                 const ExpertWeightsBf16& w, const ExpertsShape& shape);
void experts_backward_staged_bf16(float* dx, float* dweight, const ExpertGrads& dw,
                                  const ExpertsScratch& s, const float* dy,
                                  const ExpertsActivations& act, const float* x,
                                  const int32_t* index, const float* weight,
                                  const ExpertWeightsBf16& w, const ExpertsShape& shape);

}  // namespace titan
