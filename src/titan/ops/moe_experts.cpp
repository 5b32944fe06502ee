// The experts' grouped compute (ops/moe_stages.h): every expert's SwiGLU MLP over its rows, three
// GEMMs per expert, in fp32 and with bf16 operands, beside the row-by-row references; and the
// four stages composed (`experts_staged`). The GEMM sequences are the fused kernels' of
// ops/moe.cpp, operand for operand, so the composed stages equal them bit for bit.
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/ops/moe_reference_rows.h"
#include "titan/ops/moe_rows.h"
#include "titan/ops/moe_stages.h"
#include "titan/ops/swiglu.h"

namespace titan {

using moe_rows::for_each_expert;
using moe_rows::widen;

namespace {

// fn(e, r) for every row r, e its expert: the references' loop.
template <typename Fn>
void for_each_row(const int32_t* offsets, int64_t n_experts, const Fn& fn) {
  for (int64_t e = 0; e < n_experts; ++e) {
    for (int64_t r = offsets[e]; r < offsets[e + 1]; ++r) fn(e, r);
  }
}

}  // namespace

void grouped_experts_forward(float* out_rows, const ExpertsActivations& act,
                             const ExpertsScratch& /*s: none needed*/, const float* x_rows,
                             const int32_t* offsets, const ExpertWeights& w,
                             const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter;
  for_each_expert(offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_f32(Trans::no, Trans::yes, n_e, Im, h, 1.0f, x_rows + r0 * h, h,
                       w.gate + e * Im * h, h, 0.0f, act.gate + r0 * Im, Im);
    backend().gemm_f32(Trans::no, Trans::yes, n_e, Im, h, 1.0f, x_rows + r0 * h, h,
                       w.up + e * Im * h, h, 0.0f, act.up + r0 * Im, Im);
  });
  swiglu_forward(act.act, act.gate, act.up, shape.rows() * Im);
  for_each_expert(offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_f32(Trans::no, Trans::yes, n_e, h, Im, 1.0f, act.act + r0 * Im, Im,
                       w.down + e * h * Im, Im, 0.0f, out_rows + r0 * h, h);
  });
}

void grouped_experts_backward(float* rows, float* dweight_rows, const ExpertGrads& dw,
                              const ExpertsScratch& s, const float* w_rows,
                              const ExpertsActivations& act, const float* x_rows,
                              const int32_t* offsets, const ExpertWeights& w,
                              const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter, R = shape.rows();
  const VecKernels& v = backend().vec();
  swiglu_forward(act.act, act.gate, act.up, R * Im);
  // g = dy down_e per row, unweighted: d w = <g, act>, and d act = w * g.
  for_each_expert(offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_f32(Trans::no, Trans::no, n_e, Im, h, 1.0f, rows + r0 * h, h,
                       w.down + e * h * Im, Im, 0.0f, s.dact + r0 * Im, Im);
  });
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) {
    dweight_rows[r] = v.dot(s.dact + r * Im, act.act + r * Im, Im);
    v.scale(s.dact + r * Im, w_rows[r], Im);
    v.scale(rows + r * h, w_rows[r], h);  // w * dy: down_proj's output gradient
  }
  for_each_expert(offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    if (dw.down != nullptr)
      backend().gemm_f32(Trans::yes, Trans::no, h, Im, n_e, 1.0f, rows + r0 * h, h,
                         act.act + r0 * Im, Im, 1.0f, dw.down + e * h * Im, Im);
  });
  swiglu_backward(s.dgate, s.dup, s.dact, act.gate, act.up, R * Im);
  for_each_expert(offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    if (dw.gate != nullptr)
      backend().gemm_f32(Trans::yes, Trans::no, Im, h, n_e, 1.0f, s.dgate + r0 * Im, Im,
                         x_rows + r0 * h, h, 1.0f, dw.gate + e * Im * h, h);
    if (dw.up != nullptr)
      backend().gemm_f32(Trans::yes, Trans::no, Im, h, n_e, 1.0f, s.dup + r0 * Im, Im,
                         x_rows + r0 * h, h, 1.0f, dw.up + e * Im * h, h);
    // dx rows over the (now unneeded) weighted dy rows.
    backend().gemm_f32(Trans::no, Trans::no, n_e, h, Im, 1.0f, s.dgate + r0 * Im, Im,
                       w.gate + e * Im * h, h, 0.0f, rows + r0 * h, h);
    backend().gemm_f32(Trans::no, Trans::no, n_e, h, Im, 1.0f, s.dup + r0 * Im, Im,
                       w.up + e * Im * h, h, 1.0f, rows + r0 * h, h);
  });
}

void grouped_experts_forward_bf16(float* out_rows, const ExpertsActivations& act,
                                  const ExpertsScratch& s, const uint16_t* x_rows,
                                  const int32_t* offsets, const ExpertWeightsBf16& w,
                                  const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter;
  // (R, Im) each. A forward that a backward follows computes gate and up in s.dgate and s.dup and
  // keeps them, with act, in bf16; without one (s.dgate null: inference) gate and up are computed
  // in act's fp32 rooms and not kept.
  const bool keep = s.dgate != nullptr;
  auto* act_bf16 = reinterpret_cast<uint16_t*>(act.act);
  float* gate = keep ? s.dgate : act.gate;
  float* up = keep ? s.dup : act.up;
  for_each_expert(offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_bf16(Trans::no, Trans::yes, n_e, Im, h, 1.0f, x_rows + r0 * h, h,
                        w.gate + e * Im * h, h, 0.0f, gate + r0 * Im, Im);
    backend().gemm_bf16(Trans::no, Trans::yes, n_e, Im, h, 1.0f, x_rows + r0 * h, h,
                        w.up + e * Im * h, h, 0.0f, up + r0 * Im, Im);
  });
  swiglu_forward_bf16(act_bf16, keep ? reinterpret_cast<uint16_t*>(act.gate) : nullptr,
                      keep ? reinterpret_cast<uint16_t*>(act.up) : nullptr, gate, up,
                      shape.rows() * Im);
  for_each_expert(offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_bf16(Trans::no, Trans::yes, n_e, h, Im, 1.0f, act_bf16 + r0 * Im, Im,
                        w.down + e * h * Im, Im, 0.0f, out_rows + r0 * h, h);
  });
}

void grouped_experts_backward_bf16(float* rows, float* dweight_rows, const ExpertGrads& dw,
                                   const ExpertsScratch& s, const float* w_rows,
                                   const ExpertsActivations& act, const uint16_t* x_rows,
                                   const int32_t* offsets, const ExpertWeightsBf16& w,
                                   const ExpertsShape& shape) {
  TITAN_CHECK(s.out != nullptr, "grouped_experts_backward_bf16: no room for the outputs (s.out)");
  const int64_t h = shape.hidden, Im = shape.inter, R = shape.rows();
  const VecKernels& v = backend().vec();
  // s.out holds the recomputed outputs (R, h), then w * dy rounded, down_proj's output gradient;
  // s.dgate and s.dup hold d gate and d up (R, Im) rounded.
  auto* dy_down_bf16 = reinterpret_cast<uint16_t*>(s.out);
  auto* dgate_bf16 = reinterpret_cast<uint16_t*>(s.dgate);
  auto* dup_bf16 = reinterpret_cast<uint16_t*>(s.dup);
  auto* act_bf16 = reinterpret_cast<uint16_t*>(act.act);
  const auto* gate_kept = reinterpret_cast<const uint16_t*>(act.gate);
  const auto* up_kept = reinterpret_cast<const uint16_t*>(act.up);
  swiglu_recompute_bf16(act_bf16, gate_kept, up_kept, R * Im);
  // The experts' outputs again: d w is <dy, output>.
  for_each_expert(offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_bf16(Trans::no, Trans::yes, n_e, h, Im, 1.0f, act_bf16 + r0 * Im, Im,
                        w.down + e * h * Im, Im, 0.0f, s.out + r0 * h, h);
  });
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) dweight_rows[r] = v.dot(rows + r * h, s.out + r * h, h);
    // A second pass: the rounded rows overwrite the outputs another thread may still be reading.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < R; ++r) v.round_to_bf16(dy_down_bf16 + r * h, rows + r * h, w_rows[r], h);
  for_each_expert(offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_bf16(Trans::no, Trans::no, n_e, Im, h, 1.0f, dy_down_bf16 + r0 * h, h,
                        w.down + e * h * Im, Im, 0.0f, s.dact + r0 * Im, Im);
    if (dw.down != nullptr)
      backend().gemm_bf16(Trans::yes, Trans::no, h, Im, n_e, 1.0f, dy_down_bf16 + r0 * h, h,
                          act_bf16 + r0 * Im, Im, 1.0f, dw.down + e * h * Im, Im);
  });
  swiglu_backward_bf16(dgate_bf16, dup_bf16, s.dact, gate_kept, up_kept, R * Im);
  for_each_expert(offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    if (dw.gate != nullptr)
      backend().gemm_bf16(Trans::yes, Trans::no, Im, h, n_e, 1.0f, dgate_bf16 + r0 * Im, Im,
                          x_rows + r0 * h, h, 1.0f, dw.gate + e * Im * h, h);
    if (dw.up != nullptr)
      backend().gemm_bf16(Trans::yes, Trans::no, Im, h, n_e, 1.0f, dup_bf16 + r0 * Im, Im,
                          x_rows + r0 * h, h, 1.0f, dw.up + e * Im * h, h);
    // dx rows over the (now unneeded) dy rows.
    backend().gemm_bf16(Trans::no, Trans::no, n_e, h, Im, 1.0f, dgate_bf16 + r0 * Im, Im,
                        w.gate + e * Im * h, h, 0.0f, rows + r0 * h, h);
    backend().gemm_bf16(Trans::no, Trans::no, n_e, h, Im, 1.0f, dup_bf16 + r0 * Im, Im,
                        w.up + e * Im * h, h, 1.0f, rows + r0 * h, h);
  });
}

void grouped_experts_forward_reference(float* out_rows, const ExpertsActivations& act,
                                       const ExpertsScratch& /*s: none needed*/,
                                       const float* x_rows, const int32_t* offsets,
                                       const ExpertWeights& w, const ExpertsShape& shape) {
  const int64_t h = shape.hidden;
  std::vector<double> out(static_cast<size_t>(h));
  for_each_row(offsets, shape.n_experts, [&](int64_t e, int64_t r) {
    moe_reference::row_forward(out.data(), act, x_rows + r * h, e, r, w, shape);
    for (int64_t c = 0; c < h; ++c) out_rows[r * h + c] = static_cast<float>(out[c]);
  });
}

void grouped_experts_backward_reference(float* rows, float* dweight_rows, const ExpertGrads& dw,
                                        const ExpertsScratch& /*s: none needed*/,
                                        const float* w_rows, const ExpertsActivations& act,
                                        const float* x_rows, const int32_t* offsets,
                                        const ExpertWeights& w, const ExpertsShape& shape) {
  const int64_t h = shape.hidden;
  std::vector<double> dxr(static_cast<size_t>(h));
  for_each_row(offsets, shape.n_experts, [&](int64_t e, int64_t r) {
    float* dyr = rows + r * h;  // dy in, dx out
    std::fill(dxr.begin(), dxr.end(), 0.0);
    dweight_rows[r] = moe_reference::row_backward(dxr.data(), dw, dyr, w_rows[r], act,
                                                  x_rows + r * h, e, r, w, shape);
    for (int64_t c = 0; c < h; ++c) dyr[c] = static_cast<float>(dxr[c]);
  });
}

void grouped_experts_forward_bf16_reference(float* out_rows, const ExpertsActivations& act,
                                            const ExpertsScratch& /*s: none needed*/,
                                            const uint16_t* x_rows, const int32_t* offsets,
                                            const ExpertWeightsBf16& w, const ExpertsShape& shape) {
  const int64_t h = shape.hidden;
  std::vector<double> out(static_cast<size_t>(h)), xr(static_cast<size_t>(h));
  for_each_row(offsets, shape.n_experts, [&](int64_t e, int64_t r) {
    for (int64_t c = 0; c < h; ++c) xr[c] = widen(x_rows[r * h + c]);
    moe_reference::row_forward_bf16(out.data(), act, xr.data(), e, r, w, shape);
    for (int64_t c = 0; c < h; ++c) out_rows[r * h + c] = static_cast<float>(out[c]);
  });
}

void grouped_experts_backward_bf16_reference(float* rows, float* dweight_rows,
                                             const ExpertGrads& dw,
                                             const ExpertsScratch& /*s: none needed*/,
                                             const float* w_rows, const ExpertsActivations& act,
                                             const uint16_t* x_rows, const int32_t* offsets,
                                             const ExpertWeightsBf16& w,
                                             const ExpertsShape& shape) {
  const int64_t h = shape.hidden;
  std::vector<double> dxr(static_cast<size_t>(h)), xr(static_cast<size_t>(h));
  for_each_row(offsets, shape.n_experts, [&](int64_t e, int64_t r) {
    float* dyr = rows + r * h;  // dy in, dx out
    for (int64_t c = 0; c < h; ++c) xr[c] = widen(x_rows[r * h + c]);
    std::fill(dxr.begin(), dxr.end(), 0.0);
    dweight_rows[r] = moe_reference::row_backward_bf16(dxr.data(), dw, dyr, w_rows[r], act,
                                                       xr.data(), e, r, w, shape);
    for (int64_t c = 0; c < h; ++c) dyr[c] = static_cast<float>(dxr[c]);
  });
}

void experts_forward_staged(float* y, const ExpertsActivations& act, const ExpertsScratch& s,
                            const float* x, const int32_t* index, const float* weight,
                            const ExpertWeights& w, const ExpertsShape& shape) {
  moe_dispatch_plan(act.row_of, act.offsets, index, shape);
  moe_dispatch_forward(s.x, x, act.row_of, shape);
  grouped_experts_forward(s.y, act, s, s.x, act.offsets, w, shape);
  moe_combine_forward(y, s.y, act.row_of, index, weight, shape);
}

void experts_backward_staged(float* dx, float* dweight, const ExpertGrads& dw,
                             const ExpertsScratch& s, const float* dy,
                             const ExpertsActivations& act, const float* x,
                             const int32_t* /*index: the forward's act.row_of is reused*/,
                             const float* weight, const ExpertWeights& w,
                             const ExpertsShape& shape) {
  TITAN_CHECK(s.w_rows != nullptr && s.dweight_rows != nullptr,
              "experts_backward_staged: no room for the rows' weights (s.w_rows, s.dweight_rows)");
  moe_combine_backward(s.y, s.w_rows, dy, weight, act.row_of, shape);
  // Other layers' forwards reused s.x since this layer's.
  moe_dispatch_forward(s.x, x, act.row_of, shape);
  grouped_experts_backward(s.y, s.dweight_rows, dw, s, s.w_rows, act, s.x, act.offsets, w, shape);
  moe_dispatch_backward(dx, dweight, s.y, s.dweight_rows, act.row_of, shape);
}

void experts_forward_staged_bf16(float* y, const ExpertsActivations& act, const ExpertsScratch& s,
                                 const float* x, const int32_t* index, const float* weight,
                                 const ExpertWeightsBf16& w, const ExpertsShape& shape) {
  auto* x_rows = reinterpret_cast<uint16_t*>(s.x);  // (R, h) in the first half of s.x
  moe_dispatch_plan(act.row_of, act.offsets, index, shape);
  moe_dispatch_forward_bf16(x_rows, x, act.row_of, shape);
  grouped_experts_forward_bf16(s.y, act, s, x_rows, act.offsets, w, shape);
  moe_combine_forward(y, s.y, act.row_of, index, weight, shape);
}

void experts_backward_staged_bf16(float* dx, float* dweight, const ExpertGrads& dw,
                                  const ExpertsScratch& s, const float* dy,
                                  const ExpertsActivations& act, const float* x,
                                  const int32_t* /*index: the forward's act.row_of is reused*/,
                                  const float* weight, const ExpertWeightsBf16& w,
                                  const ExpertsShape& shape) {
  TITAN_CHECK(s.w_rows != nullptr && s.dweight_rows != nullptr,
              "experts_backward_staged_bf16: no room for the rows' weights (s.w_rows, "
              "s.dweight_rows)");
  auto* x_rows = reinterpret_cast<uint16_t*>(s.x);
  moe_combine_backward(s.y, s.w_rows, dy, weight, act.row_of, shape);
  moe_dispatch_forward_bf16(x_rows, x, act.row_of, shape);
  grouped_experts_backward_bf16(s.y, s.dweight_rows, dw, s, s.w_rows, act, x_rows, act.offsets, w,
                                shape);
  moe_dispatch_backward(dx, dweight, s.y, s.dweight_rows, act.row_of, shape);
}

}  // namespace titan
