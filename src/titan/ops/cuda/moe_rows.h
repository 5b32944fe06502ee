// The MoE kernels' bodies (ops/moe.h's router and load-balancing statistics, ops/moe_stages.h's
// dispatch, grouped compute and combine), one token, expert, row or element per device thread
// (moe_route.cu, moe_dispatch.cu, moe_experts.cu), or a row split over a team; the host test
// (tests/unit/test_cuda_rows.cpp) runs this same code against the CPU ops.
//
// Where the CPU's arithmetic is serial, these bodies repeat it operation for operation, so the
// results are the CPU's bits: the dispatch plan (a counting sort), the gathers, the sums of a
// token's dx rows (fp32 adds in slot order), the router's backward (its fp64 sums), the
// load-balancing statistics. The combine's weighted sum is fmaf in ascending expert order, what the
// CPU's axpy computes where its vector ISA fuses (AVX2, AVX-512: -ffp-contract=fast). The router's
// softmax uses expf where the CPU uses its vector exp approximation, so probabilities and weights
// differ by a few ulps; the ids are the CPU's wherever those ulps do not reorder two probabilities
// (exact ties are broken as the CPU's: the lower expert first, for equal logits give equal
// probabilities in both).
#pragma once

#include <cmath>

#include "titan/ops/cuda/elementwise_rows.h"
#include "titan/ops/cuda/hd.h"

namespace titan::cuda_rows {

// sum + a * b with the product rounded before the add, as the CPU's ops compute it (x86-64-v2: no
// FMA); nvcc would fuse the two on the device.
TITAN_HD inline double add_product(double sum, double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(sum, __dmul_rn(a, b));
#else
  return sum + a * b;
#endif
}

// Router forward of token t (ops/moe.h's router_topk_forward): probs (E) = softmax(logits (E)),
// index and weight (k) the k largest in descending order, the lower expert first on ties,
// renormalised over the picked when norm_topk_prob.
TITAN_HD inline void router_token_forward(int32_t* index, float* weight, float* probs,
                                          const float* logits, int64_t n_experts, int64_t top_k,
                                          bool norm_topk_prob, int64_t t) {
  const float* l = logits + t * n_experts;
  float* p = probs + t * n_experts;
  float m = -INFINITY;
  for (int64_t e = 0; e < n_experts; ++e) m = fmaxf(m, l[e]);
  float sum = 0.0f;
  for (int64_t e = 0; e < n_experts; ++e) {
    p[e] = expf(l[e] - m);
    sum += p[e];
  }
  for (int64_t e = 0; e < n_experts; ++e) p[e] /= sum;
  int32_t* idx = index + t * top_k;
  float* w = weight + t * top_k;
  float picked_sum = 0.0f;
  for (int64_t j = 0; j < top_k; ++j) {
    int32_t best = -1;
    for (int64_t e = 0; e < n_experts; ++e) {
      bool taken = false;
      for (int64_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
      if (!taken && (best < 0 || p[e] > p[best])) best = static_cast<int32_t>(e);
    }
    idx[j] = best;
    w[j] = p[best];
    picked_sum += p[best];
  }
  if (norm_topk_prob) {
    for (int64_t j = 0; j < top_k; ++j) w[j] /= picked_sum;
  }
}

// Router backward of token t (router_topk_backward): dlogits (E) from dweight (k) through the
// renormalisation and the softmax, dprobs_all (E, optional) added to every row's d probs. The
// CPU's operations in its order, fp64 sums included.
TITAN_HD inline void router_token_backward(float* dlogits, const float* dweight,
                                           const float* dprobs_all, const float* probs,
                                           const int32_t* index, int64_t n_experts, int64_t top_k,
                                           bool norm_topk_prob, int64_t t) {
  const float* p = probs + t * n_experts;
  const int32_t* idx = index + t * top_k;
  const float* dw = dweight + t * top_k;
  float* dp = dlogits + t * n_experts;  // d loss / d probs first, then turned into dlogits
  for (int64_t e = 0; e < n_experts; ++e) dp[e] = dprobs_all != nullptr ? dprobs_all[e] : 0.0f;
  double picked_sum = 0.0, dw_dot_w = 0.0;
  for (int64_t j = 0; j < top_k; ++j) picked_sum += p[idx[j]];
  for (int64_t j = 0; j < top_k; ++j) dw_dot_w = add_product(dw_dot_w, dw[j], p[idx[j]]);
  dw_dot_w /= picked_sum;
  for (int64_t j = 0; j < top_k; ++j) {
    dp[idx[j]] += norm_topk_prob ? static_cast<float>((dw[j] - dw_dot_w) / picked_sum) : dw[j];
  }
  double p_dot_dp = 0.0;
  for (int64_t e = 0; e < n_experts; ++e) p_dot_dp = add_product(p_dot_dp, p[e], dp[e]);
  for (int64_t e = 0; e < n_experts; ++e) dp[e] = static_cast<float>(p[e] * (dp[e] - p_dot_dp));
}

// Dispatch plan (moe_dispatch_plan's counting sort), in three passes over the (token, slot) pairs
// p in [0, rows): count_expert writes offsets[e + 1] = expert e's rows (one thread per expert),
// prefix_offsets sums them (one thread), place_expert gives expert e's pairs its rows in pair
// order from offsets[e] (one thread per expert): row_of equals the CPU's, which also visits the
// pairs in order. Every index was checked against [0, E).
TITAN_HD inline void count_expert(int32_t* offsets, const int32_t* index, int64_t rows, int64_t e) {
  int32_t count = 0;
  for (int64_t p = 0; p < rows; ++p) count += index[p] == e ? 1 : 0;
  offsets[e + 1] = count;
}
TITAN_HD inline void prefix_offsets(int32_t* offsets, int64_t n_experts) {
  offsets[0] = 0;
  for (int64_t e = 0; e < n_experts; ++e) offsets[e + 1] += offsets[e];
}
TITAN_HD inline void place_expert(int32_t* row_of, const int32_t* offsets, const int32_t* index,
                                  int64_t rows, int64_t e) {
  int32_t next = offsets[e];
  for (int64_t p = 0; p < rows; ++p) {
    if (index[p] == e) row_of[p] = next++;
  }
}

// Element i of the gathered rows (rows, dim): pair p = i / dim's row = its token's row of src
// (N, dim); the bf16 form rounds it.
TITAN_HD inline void gather_row_element(float* dst, const float* src, const int32_t* row_of,
                                        int64_t top_k, int64_t dim, int64_t i) {
  const int64_t p = i / dim, c = i % dim;
  dst[static_cast<int64_t>(row_of[p]) * dim + c] = src[(p / top_k) * dim + c];
}
TITAN_HD inline void gather_row_element_bf16(uint16_t* dst, const float* src, const int32_t* row_of,
                                             int64_t top_k, int64_t dim, int64_t i) {
  const int64_t p = i / dim, c = i % dim;
  dst[static_cast<int64_t>(row_of[p]) * dim + c] = to_bf16(src[(p / top_k) * dim + c]);
}

// The slot of token t's top-k (index_t) holding the smallest expert above `after`
// (ops/moe_rows.h's next_slot_by_expert).
TITAN_HD inline int64_t next_slot_by_expert(const int32_t* index_t, int64_t top_k, int32_t after) {
  int64_t best = -1;
  for (int64_t j = 0; j < top_k; ++j) {
    if (index_t[j] > after && (best < 0 || index_t[j] < index_t[best])) best = j;
  }
  return best;
}

// Combine, element i = (t, c) of y (N, h): token t's weighted rows of out_rows (rows, h) summed in
// ascending expert order from zero.
TITAN_HD inline void combine_element(float* y, const float* out_rows, const int32_t* row_of,
                                     const int32_t* index, const float* weight, int64_t top_k,
                                     int64_t hidden, int64_t i) {
  const int64_t t = i / hidden, c = i % hidden;
  float acc = 0.0f;
  int32_t last = -1;
  for (int64_t step = 0; step < top_k; ++step) {
    const int64_t j = next_slot_by_expert(index + t * top_k, top_k, last);
    last = index[t * top_k + j];
    acc = fmaf(weight[t * top_k + j],
               out_rows[static_cast<int64_t>(row_of[t * top_k + j]) * hidden + c], acc);
  }
  y[i] = acc;
}

// Dispatch backward, element i = (t, c) of dx (N, h): token t's k rows of dx_rows (rows, h) summed
// in slot order from zero (the CPU's axpy by 1: the same adds).
TITAN_HD inline void sum_token_rows_element(float* dx, const float* dx_rows, const int32_t* row_of,
                                            int64_t top_k, int64_t hidden, int64_t i) {
  const int64_t t = i / hidden, c = i % hidden;
  float acc = 0.0f;
  for (int64_t j = 0; j < top_k; ++j) {
    acc += dx_rows[static_cast<int64_t>(row_of[t * top_k + j]) * hidden + c];
  }
  dx[i] = acc;
}

// Grouped experts' fp32 backward, row r split over a team (grouped_experts_backward's per-row
// step): dweight_row = <g, act> over the row's Im values of g = dy down_e (in dact), then dact
// scaled by the row's weight w, and the row's dy (h) too (down_proj's output gradient). The CPU's
// dot sums in vector lanes; this sums over the team: the two differ by fp32 rounding.
template <typename Team>
TITAN_HD void experts_row_weight_grad(const Team& team, float* dweight_row, float* dact,
                                      const float* act, float* dy, float w, int64_t inter,
                                      int64_t hidden) {
  float part = 0.0f;
  for (int64_t i = team.rank(); i < inter; i += team.size()) part += dact[i] * act[i];
  const float dot = team.sum(part);
  for (int64_t i = team.rank(); i < inter; i += team.size()) dact[i] *= w;
  for (int64_t i = team.rank(); i < hidden; i += team.size()) dy[i] *= w;
  if (team.rank() == 0) *dweight_row = dot;
}

// The bf16 backward's d weight of a row: <dy, out> over h (a team's sum, the CPU's in lanes).
template <typename Team>
TITAN_HD void experts_row_dot(const Team& team, float* dweight_row, const float* dy,
                              const float* out, int64_t hidden) {
  float part = 0.0f;
  for (int64_t i = team.rank(); i < hidden; i += team.size()) part += dy[i] * out[i];
  const float dot = team.sum(part);
  if (team.rank() == 0) *dweight_row = dot;
}

// Element i = (r, c) of the bf16 backward's down_proj output gradient: w_r * dy rounded to bf16
// (the CPU's round_to_bf16 with scale w_r: one product, one rounding).
TITAN_HD inline void scaled_row_element_bf16(uint16_t* dst, const float* rows, const float* w_rows,
                                             int64_t hidden, int64_t i) {
  dst[i] = to_bf16(rows[i] * w_rows[i / hidden]);
}

// SwiGLU's bf16 forward (ops/swiglu.h's swiglu_forward_bf16), element i: gate and up rounded (kept
// unless null), act = bf16(silu(gate) * up) over the roundings, as swiglu.cu's recompute.
TITAN_HD inline void swiglu_forward_bf16_element(uint16_t* act, uint16_t* gate_kept,
                                                 uint16_t* up_kept, const float* gate,
                                                 const float* up, int64_t i) {
  const uint16_t g = to_bf16(gate[i]), u = to_bf16(up[i]);
  if (gate_kept != nullptr) gate_kept[i] = g;
  if (up_kept != nullptr) up_kept[i] = u;
  act[i] = to_bf16(swiglu(from_bf16(g), from_bf16(u)));
}

// Load-balancing statistics of expert e (load_balancing_accumulate), one thread per expert:
// counts[e] += its routed pairs, prob_sums[e] += its probabilities in token order, onto the values
// already there (the CPU adds each into the running total in the same order).
TITAN_HD inline void load_balancing_expert(double* counts, double* prob_sums, const float* probs,
                                           const int32_t* index, int64_t n_tokens,
                                           int64_t n_experts, int64_t top_k, int64_t e) {
  double count = counts[e];
  for (int64_t p = 0; p < n_tokens * top_k; ++p) {
    if (index[p] == e) count += 1.0;
  }
  counts[e] = count;
  double sum = prob_sums[e];
  for (int64_t t = 0; t < n_tokens; ++t) sum += probs[t * n_experts + e];
  prob_sums[e] = sum;
}

}  // namespace titan::cuda_rows
