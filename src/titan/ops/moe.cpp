#include "titan/ops/moe.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/ops/bf16_arrays.h"
#include "titan/ops/host_parallel.h"
#include "titan/ops/moe_reference_rows.h"
#include "titan/ops/moe_rows.h"
#include "titan/ops/swiglu.h"

namespace titan {

using namespace moe_rows;

void experts_forward_grouped(float* y, const ExpertsActivations& act, const ExpertsScratch& s,
                             const float* x, const int32_t* index, const float* weight,
                             const ExpertWeights& w, const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter;
  group_rows_by_expert(act.row_of, act.offsets, index, shape);
  gather_token_rows(s.x, x, act.row_of, shape, h);
  for_each_expert(act.offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_f32(Trans::no, Trans::yes, n_e, Im, h, 1.0f, s.x + r0 * h, h,
                       w.gate + e * Im * h, h, 0.0f, act.gate + r0 * Im, Im);
    backend().gemm_f32(Trans::no, Trans::yes, n_e, Im, h, 1.0f, s.x + r0 * h, h, w.up + e * Im * h,
                       h, 0.0f, act.up + r0 * Im, Im);
  });
  swiglu_forward(act.act, act.gate, act.up, shape.rows() * Im);
  for_each_expert(act.offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_f32(Trans::no, Trans::yes, n_e, h, Im, 1.0f, act.act + r0 * Im, Im,
                       w.down + e * h * Im, Im, 0.0f, s.y + r0 * h, h);
  });
  sum_weighted_expert_rows(y, s.y, act.row_of, index, weight, shape);
}

void experts_backward_grouped(float* dx, float* dweight, const ExpertGrads& dw,
                              const ExpertsScratch& s, const float* dy,
                              const ExpertsActivations& act, const float* x,
                              const int32_t* /*index: the forward's act.row_of is reused*/,
                              const float* weight, const ExpertWeights& w,
                              const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter, rows = shape.rows();
  const VecKernels& v = backend().vec();
  // Other layers' forwards reused s.x and act since this layer's.
  gather_token_rows(s.x, x, act.row_of, shape, h);
  gather_token_rows(s.y, dy, act.row_of, shape, h);
  swiglu_forward(act.act, act.gate, act.up, rows * Im);
  // g = dy down_e per row, unweighted: dweight = <g, act>, and d act = weight * g.
  for_each_expert(act.offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_f32(Trans::no, Trans::no, n_e, Im, h, 1.0f, s.y + r0 * h, h, w.down + e * h * Im,
                       Im, 0.0f, s.dact + r0 * Im, Im);
  });
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < rows; ++p) {
    const int64_t r = act.row_of[p];
    dweight[p] = v.dot(s.dact + r * Im, act.act + r * Im, Im);
    v.scale(s.dact + r * Im, weight[p], Im);
    v.scale(s.y + r * h, weight[p], h);  // weight * dy: down_proj's output gradient
  }
  for_each_expert(act.offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    if (dw.down != nullptr)
      backend().gemm_f32(Trans::yes, Trans::no, h, Im, n_e, 1.0f, s.y + r0 * h, h,
                         act.act + r0 * Im, Im, 1.0f, dw.down + e * h * Im, Im);
  });
  swiglu_backward(s.dgate, s.dup, s.dact, act.gate, act.up, rows * Im);
  for_each_expert(act.offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    if (dw.gate != nullptr)
      backend().gemm_f32(Trans::yes, Trans::no, Im, h, n_e, 1.0f, s.dgate + r0 * Im, Im,
                         s.x + r0 * h, h, 1.0f, dw.gate + e * Im * h, h);
    if (dw.up != nullptr)
      backend().gemm_f32(Trans::yes, Trans::no, Im, h, n_e, 1.0f, s.dup + r0 * Im, Im, s.x + r0 * h,
                         h, 1.0f, dw.up + e * Im * h, h);
    // d x rows over the (now unneeded) weighted dy rows.
    backend().gemm_f32(Trans::no, Trans::no, n_e, h, Im, 1.0f, s.dgate + r0 * Im, Im,
                       w.gate + e * Im * h, h, 0.0f, s.y + r0 * h, h);
    backend().gemm_f32(Trans::no, Trans::no, n_e, h, Im, 1.0f, s.dup + r0 * Im, Im,
                       w.up + e * Im * h, h, 1.0f, s.y + r0 * h, h);
  });
  sum_token_rows(dx, s.y, act.row_of, shape);
}

void experts_forward_grouped_bf16(float* y, const ExpertsActivations& act, const ExpertsScratch& s,
                                  const float* x, const int32_t* index, const float* weight,
                                  const ExpertWeightsBf16& w, const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter;
  auto* x_bf16 = reinterpret_cast<uint16_t*>(s.x);  // (N*k, h) in the first half of s.x
  // (N*k, Im) each. A forward that a backward follows computes gate and up in s.dgate and s.dup
  // and keeps them, with act, in bf16. Without one (s.dgate null: inference) gate and up are
  // computed in act's fp32 rooms and not kept.
  const bool keep = s.dgate != nullptr;
  auto* act_bf16 = reinterpret_cast<uint16_t*>(act.act);
  float* gate = keep ? s.dgate : act.gate;
  float* up = keep ? s.dup : act.up;
  group_rows_by_expert(act.row_of, act.offsets, index, shape);
  gather_token_rows_bf16(x_bf16, x, act.row_of, shape, h);
  for_each_expert(act.offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_bf16(Trans::no, Trans::yes, n_e, Im, h, 1.0f, x_bf16 + r0 * h, h,
                        w.gate + e * Im * h, h, 0.0f, gate + r0 * Im, Im);
    backend().gemm_bf16(Trans::no, Trans::yes, n_e, Im, h, 1.0f, x_bf16 + r0 * h, h,
                        w.up + e * Im * h, h, 0.0f, up + r0 * Im, Im);
  });
  swiglu_forward_bf16(act_bf16, keep ? reinterpret_cast<uint16_t*>(act.gate) : nullptr,
                      keep ? reinterpret_cast<uint16_t*>(act.up) : nullptr, gate, up,
                      shape.rows() * Im);
  for_each_expert(act.offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_bf16(Trans::no, Trans::yes, n_e, h, Im, 1.0f, act_bf16 + r0 * Im, Im,
                        w.down + e * h * Im, Im, 0.0f, s.y + r0 * h, h);
  });
  sum_weighted_expert_rows(y, s.y, act.row_of, index, weight, shape);
}

void experts_backward_grouped_bf16(float* dx, float* dweight, const ExpertGrads& dw,
                                   const ExpertsScratch& s, const float* dy,
                                   const ExpertsActivations& act, const float* x,
                                   const int32_t* /*index: the forward's act.row_of is reused*/,
                                   const float* weight, const ExpertWeightsBf16& w,
                                   const ExpertsShape& shape) {
  const int64_t h = shape.hidden, Im = shape.inter, k = shape.top_k, rows = shape.rows();
  const VecKernels& v = backend().vec();
  // The rounded operands live in the fp32 scratch: s.x holds the gathered rows and then
  // weight * dy, down_proj's output gradient (N*k, h) each; s.dgate and s.dup hold d gate and d up
  // (N*k, Im) rounded.
  auto* x_bf16 = reinterpret_cast<uint16_t*>(s.x);
  uint16_t* dy_down_bf16 = x_bf16 + rows * h;
  auto* dgate_bf16 = reinterpret_cast<uint16_t*>(s.dgate);
  auto* dup_bf16 = reinterpret_cast<uint16_t*>(s.dup);
  auto* act_bf16 = reinterpret_cast<uint16_t*>(act.act);
  const auto* gate_kept = reinterpret_cast<const uint16_t*>(act.gate);
  const auto* up_kept = reinterpret_cast<const uint16_t*>(act.up);
  // Other layers' forwards reused s.x and act since this layer's.
  gather_token_rows_bf16(x_bf16, x, act.row_of, shape, h);
  swiglu_recompute_bf16(act_bf16, gate_kept, up_kept, rows * Im);
  // The experts' outputs again: d weight is <dy, output>.
  for_each_expert(act.offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_bf16(Trans::no, Trans::yes, n_e, h, Im, 1.0f, act_bf16 + r0 * Im, Im,
                        w.down + e * h * Im, Im, 0.0f, s.y + r0 * h, h);
  });
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < rows; ++p) {
    const int64_t r = act.row_of[p];
    const float* dyt = dy + (p / k) * h;
    dweight[p] = v.dot(dyt, s.y + r * h, h);
    v.round_to_bf16(dy_down_bf16 + r * h, dyt, weight[p], h);
  }
  for_each_expert(act.offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    backend().gemm_bf16(Trans::no, Trans::no, n_e, Im, h, 1.0f, dy_down_bf16 + r0 * h, h,
                        w.down + e * h * Im, Im, 0.0f, s.dact + r0 * Im, Im);
    if (dw.down != nullptr)
      backend().gemm_bf16(Trans::yes, Trans::no, h, Im, n_e, 1.0f, dy_down_bf16 + r0 * h, h,
                          act_bf16 + r0 * Im, Im, 1.0f, dw.down + e * h * Im, Im);
  });
  swiglu_backward_bf16(dgate_bf16, dup_bf16, s.dact, gate_kept, up_kept, rows * Im);
  for_each_expert(act.offsets, shape.n_experts, [&](int64_t e, int64_t r0, int64_t n_e) {
    if (dw.gate != nullptr)
      backend().gemm_bf16(Trans::yes, Trans::no, Im, h, n_e, 1.0f, dgate_bf16 + r0 * Im, Im,
                          x_bf16 + r0 * h, h, 1.0f, dw.gate + e * Im * h, h);
    if (dw.up != nullptr)
      backend().gemm_bf16(Trans::yes, Trans::no, Im, h, n_e, 1.0f, dup_bf16 + r0 * Im, Im,
                          x_bf16 + r0 * h, h, 1.0f, dw.up + e * Im * h, h);
    // d x rows over the (now unneeded) expert outputs.
    backend().gemm_bf16(Trans::no, Trans::no, n_e, h, Im, 1.0f, dgate_bf16 + r0 * Im, Im,
                        w.gate + e * Im * h, h, 0.0f, s.y + r0 * h, h);
    backend().gemm_bf16(Trans::no, Trans::no, n_e, h, Im, 1.0f, dup_bf16 + r0 * Im, Im,
                        w.up + e * Im * h, h, 1.0f, s.y + r0 * h, h);
  });
  sum_token_rows(dx, s.y, act.row_of, shape);
}

void experts_forward_reference(float* y, const ExpertsActivations& act,
                               const ExpertsScratch& /*scratch: none needed*/, const float* x,
                               const int32_t* index, const float* weight, const ExpertWeights& w,
                               const ExpertsShape& shape) {
  const int64_t h = shape.hidden, k = shape.top_k;
  std::vector<double> out(static_cast<size_t>(h)), expert_out(static_cast<size_t>(h));
  for (int64_t t = 0; t < shape.n_tokens; ++t) {
    std::fill(out.begin(), out.end(), 0.0);
    int32_t last = -1;
    for (int64_t step = 0; step < k; ++step) {
      const int64_t j = next_slot_by_expert(index + t * k, k, last);
      const int32_t e = index[t * k + j];
      last = e;
      TITAN_CHECK(e >= 0 && e < shape.n_experts, "experts: token ", t, " is routed to expert ", e,
                  ", outside [0, ", shape.n_experts, ")");
      const int64_t r = t * k + j;
      moe_reference::row_forward(expert_out.data(), act, x + t * h, e, r, w, shape);
      for (int64_t c = 0; c < h; ++c) out[c] += weight[r] * expert_out[c];
    }
    for (int64_t c = 0; c < h; ++c) y[t * h + c] = static_cast<float>(out[c]);
  }
}

void experts_backward_reference(float* dx, float* dweight, const ExpertGrads& dw,
                                const ExpertsScratch& /*scratch: none needed*/, const float* dy,
                                const ExpertsActivations& act, const float* x, const int32_t* index,
                                const float* weight, const ExpertWeights& w,
                                const ExpertsShape& shape) {
  const int64_t h = shape.hidden, k = shape.top_k;
  std::vector<double> dxt(static_cast<size_t>(h));
  for (int64_t t = 0; t < shape.n_tokens; ++t) {
    std::fill(dxt.begin(), dxt.end(), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = t * k + j;
      dweight[r] = moe_reference::row_backward(dxt.data(), dw, dy + t * h, weight[r], act,
                                               x + t * h, index[r], r, w, shape);
    }
    for (int64_t c = 0; c < h; ++c) dx[t * h + c] = static_cast<float>(dxt[c]);
  }
}

void experts_forward_bf16_reference(float* y, const ExpertsActivations& act,
                                    const ExpertsScratch& /*scratch: none needed*/, const float* x,
                                    const int32_t* index, const float* weight,
                                    const ExpertWeightsBf16& w, const ExpertsShape& shape) {
  const int64_t h = shape.hidden, k = shape.top_k;
  std::vector<double> out(static_cast<size_t>(h)), expert_out(static_cast<size_t>(h)),
      xr(static_cast<size_t>(h));
  for (int64_t t = 0; t < shape.n_tokens; ++t) {
    for (int64_t c = 0; c < h; ++c) xr[c] = round_bf16(x[t * h + c]);
    std::fill(out.begin(), out.end(), 0.0);
    int32_t last = -1;
    for (int64_t step = 0; step < k; ++step) {
      const int64_t j = next_slot_by_expert(index + t * k, k, last);
      const int32_t e = index[t * k + j];
      last = e;
      TITAN_CHECK(e >= 0 && e < shape.n_experts, "experts: token ", t, " is routed to expert ", e,
                  ", outside [0, ", shape.n_experts, ")");
      const int64_t r = t * k + j;
      moe_reference::row_forward_bf16(expert_out.data(), act, xr.data(), e, r, w, shape);
      for (int64_t c = 0; c < h; ++c) {
        out[c] += weight[r] * static_cast<double>(static_cast<float>(expert_out[c]));
      }
    }
    for (int64_t c = 0; c < h; ++c) y[t * h + c] = static_cast<float>(out[c]);
  }
}

void experts_backward_bf16_reference(float* dx, float* dweight, const ExpertGrads& dw,
                                     const ExpertsScratch& /*scratch: none needed*/,
                                     const float* dy, const ExpertsActivations& act, const float* x,
                                     const int32_t* index, const float* weight,
                                     const ExpertWeightsBf16& w, const ExpertsShape& shape) {
  const int64_t h = shape.hidden, k = shape.top_k;
  std::vector<double> dxt(static_cast<size_t>(h)), xr(static_cast<size_t>(h));
  for (int64_t t = 0; t < shape.n_tokens; ++t) {
    for (int64_t c = 0; c < h; ++c) xr[c] = round_bf16(x[t * h + c]);
    std::fill(dxt.begin(), dxt.end(), 0.0);
    for (int64_t j = 0; j < k; ++j) {
      const int64_t r = t * k + j;
      dweight[r] = moe_reference::row_backward_bf16(dxt.data(), dw, dy + t * h, weight[r], act,
                                                    xr.data(), index[r], r, w, shape);
    }
    for (int64_t c = 0; c < h; ++c) dx[t * h + c] = static_cast<float>(dxt[c]);
  }
}

std::string experts_check_rows(const ExpertsShape& shape) {
  if (shape.rows() > std::numeric_limits<int32_t>::max()) {
    return "tokens * num_experts_per_tok <= 2^31 - 1 (got " + std::to_string(shape.rows()) + ")";
  }
  return {};
}

void load_balancing_accumulate(double* counts, double* prob_sums, const float* probs,
                               const int32_t* index, int64_t n_tokens, int64_t n_experts,
                               int64_t top_k) {
  for (int64_t p = 0; p < n_tokens * top_k; ++p) counts[index[p]] += 1.0;
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t e = 0; e < n_experts; ++e) prob_sums[e] += probs[t * n_experts + e];
  }
}

double load_balancing_loss(const double* counts, const double* prob_sums, int64_t n_experts,
                           int64_t rows) {
  double sum = 0.0;
  const double r = static_cast<double>(rows);
  for (int64_t e = 0; e < n_experts; ++e) sum += (counts[e] / r) * (prob_sums[e] / r);
  return sum * static_cast<double>(n_experts);
}

void load_balancing_grad(float* dprobs, const double* counts, int64_t n_experts, int64_t rows,
                         double scale) {
  const double r = static_cast<double>(rows);
  for (int64_t e = 0; e < n_experts; ++e) {
    dprobs[e] = static_cast<float>(scale * static_cast<double>(n_experts) * counts[e] / (r * r));
  }
}

}  // namespace titan
