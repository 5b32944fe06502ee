// The router's second half (the first is mlp.gate, a linear): softmax, top-k and renormalisation,
// the fast kernel beside its fp64 reference (ops/moe.h).
#include <cmath>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/ops/moe.h"

namespace titan {

void router_topk_forward(int32_t* index, float* weight, float* probs, const float* logits,
                         int64_t n_tokens, int64_t n_experts, int64_t top_k, bool norm_topk_prob) {
  TITAN_CHECK(top_k >= 1 && top_k <= n_experts, "router: num_experts_per_tok (", top_k,
              ") must be in [1, num_experts = ", n_experts, "]");
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* l = logits + t * n_experts;
    float* p = probs + t * n_experts;
    const float sum = v.exp_shift_sum(p, l, n_experts, v.max(l, n_experts));
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
}

void router_topk_backward(float* dlogits, const float* dweight, const float* dprobs_all,
                          const float* probs, const int32_t* index, int64_t n_tokens,
                          int64_t n_experts, int64_t top_k, bool norm_topk_prob) {
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* p = probs + t * n_experts;
    const int32_t* idx = index + t * top_k;
    const float* dw = dweight + t * top_k;
    float* dp = dlogits + t * n_experts;  // d loss / d probs first, then turned into dlogits
    for (int64_t e = 0; e < n_experts; ++e) dp[e] = dprobs_all != nullptr ? dprobs_all[e] : 0.0f;
    // w_j = p_j / S with S = sum_i p_i over the picked: d/dp_j = (dw_j - sum_i dw_i w_i) / S.
    double picked_sum = 0.0, dw_dot_w = 0.0;
    for (int64_t j = 0; j < top_k; ++j) picked_sum += p[idx[j]];
    for (int64_t j = 0; j < top_k; ++j) dw_dot_w += static_cast<double>(dw[j]) * p[idx[j]];
    dw_dot_w /= picked_sum;
    for (int64_t j = 0; j < top_k; ++j) {
      dp[idx[j]] += norm_topk_prob ? static_cast<float>((dw[j] - dw_dot_w) / picked_sum) : dw[j];
    }
    double p_dot_dp = 0.0;
    for (int64_t e = 0; e < n_experts; ++e) p_dot_dp += static_cast<double>(p[e]) * dp[e];
    for (int64_t e = 0; e < n_experts; ++e) {
      dp[e] = static_cast<float>(p[e] * (dp[e] - p_dot_dp));
    }
  }
}

void router_topk_forward_reference(int32_t* index, float* weight, float* probs, const float* logits,
                                   int64_t n_tokens, int64_t n_experts, int64_t top_k,
                                   bool norm_topk_prob) {
  TITAN_CHECK(top_k >= 1 && top_k <= n_experts, "router: num_experts_per_tok (", top_k,
              ") must be in [1, num_experts = ", n_experts, "]");
  std::vector<double> p(static_cast<size_t>(n_experts));  // one token's probabilities, fp64
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* l = logits + t * n_experts;
    double max = l[0], sum = 0.0;
    for (int64_t e = 1; e < n_experts; ++e) max = std::max(max, static_cast<double>(l[e]));
    for (int64_t e = 0; e < n_experts; ++e) sum += p[e] = std::exp(l[e] - max);
    for (int64_t e = 0; e < n_experts; ++e) {
      p[e] /= sum;
      probs[t * n_experts + e] = static_cast<float>(p[e]);
    }
    int32_t* idx = index + t * top_k;
    double picked_sum = 0.0;
    std::vector<double> picked(static_cast<size_t>(top_k));
    for (int64_t j = 0; j < top_k; ++j) {
      int32_t best = -1;  // the largest not yet taken; ties: the lower expert
      for (int64_t e = 0; e < n_experts; ++e) {
        bool taken = false;
        for (int64_t i = 0; i < j; ++i) taken = taken || idx[i] == e;
        if (!taken && (best < 0 || p[e] > p[best])) best = static_cast<int32_t>(e);
      }
      idx[j] = best;
      picked[j] = p[best];
      picked_sum += p[best];
    }
    for (int64_t j = 0; j < top_k; ++j) {
      weight[t * top_k + j] =
          static_cast<float>(norm_topk_prob ? picked[j] / picked_sum : picked[j]);
    }
  }
}

void router_topk_backward_reference(float* dlogits, const float* dweight, const float* dprobs_all,
                                    const float* probs, const int32_t* index, int64_t n_tokens,
                                    int64_t n_experts, int64_t top_k, bool norm_topk_prob) {
  std::vector<double> dp(static_cast<size_t>(n_experts));  // d loss / d probs of one token
  for (int64_t t = 0; t < n_tokens; ++t) {
    const float* p = probs + t * n_experts;
    const int32_t* idx = index + t * top_k;
    const float* dw = dweight + t * top_k;
    for (int64_t e = 0; e < n_experts; ++e) dp[e] = dprobs_all != nullptr ? dprobs_all[e] : 0.0;
    double picked_sum = 0.0, dw_dot_w = 0.0;
    for (int64_t j = 0; j < top_k; ++j) picked_sum += p[idx[j]];
    for (int64_t j = 0; j < top_k; ++j) dw_dot_w += static_cast<double>(dw[j]) * p[idx[j]];
    dw_dot_w /= picked_sum;
    for (int64_t j = 0; j < top_k; ++j) {
      dp[idx[j]] += norm_topk_prob ? (dw[j] - dw_dot_w) / picked_sum : dw[j];
    }
    double p_dot_dp = 0.0;
    for (int64_t e = 0; e < n_experts; ++e) p_dot_dp += p[e] * dp[e];
    for (int64_t e = 0; e < n_experts; ++e) {
      dlogits[t * n_experts + e] = static_cast<float>(p[e] * (dp[e] - p_dot_dp));
    }
  }
}

}  // namespace titan
