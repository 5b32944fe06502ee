// One row of the lm_head loss (ops/cross_entropy.h's contract) over its fp32 logits, or over its
// bf16 logits (mixed precision), split over a team: the CUDA kernel (cross_entropy.cu) and the host
// test run this same code.
#pragma once

#include <cmath>

#include "titan/ops/cuda/hd.h"

namespace titan::cuda_rows {

// The row's loss, -log softmax(logits)[target] (0 where target is the ignore index), returned to
// every member. With `grad`, the logits (vocab) become d loss / d logits * grad_scale in place:
// (softmax - onehot(target)) * grad_scale, zeros for an ignored row.
template <typename Team>
TITAN_HD float cross_entropy_row(const Team& team, float* logits, int32_t target, int32_t ignore,
                                 int64_t vocab, bool grad, float grad_scale) {
  float m = -INFINITY;
  for (int64_t j = team.rank(); j < vocab; j += team.size()) m = fmaxf(m, logits[j]);
  m = team.max(m);
  float sum = 0.0f;
  for (int64_t j = team.rank(); j < vocab; j += team.size()) sum += expf(logits[j] - m);
  const float lse = m + logf(team.sum(sum));
  const bool scored = target != ignore;
  // Every member reads the target's logit before any member overwrites the row.
  const float loss = scored ? lse - logits[target] : 0.0f;
  team.sync();
  if (grad) {
    for (int64_t j = team.rank(); j < vocab; j += team.size()) {
      logits[j] =
          scored ? (expf(logits[j] - lse) - (j == target ? 1.0f : 0.0f)) * grad_scale : 0.0f;
    }
  }
  return loss;
}

// The bf16 form, at the CPU's rounding points (ops/cross_entropy.cpp's bf16_softmax_rows): the
// row's logits are the lm_head GEMM's output rounded to bf16 once, widened as read; the max, the
// sum of exp(logit - max) and the loss, max + log(sum) - the target's logit, as RowSoftmax takes
// them (the sum in fp32, the loss in fp64); with `grad`, the row becomes d loss / d logits in bf16
// in place: exp(logit - max) * (grad_scale / sum) rounded once, the target's element that minus
// grad_scale rounded from fp32; zeros for an ignored row (loss 0).
template <typename Team>
TITAN_HD double cross_entropy_row_bf16(const Team& team, uint16_t* logits, int32_t target,
                                       int32_t ignore, int64_t vocab, bool grad, float grad_scale) {
  if (target == ignore) {
    if (grad) {
      for (int64_t j = team.rank(); j < vocab; j += team.size()) logits[j] = 0;
    }
    return 0.0;
  }
  float m = -INFINITY;
  for (int64_t j = team.rank(); j < vocab; j += team.size()) m = fmaxf(m, from_bf16(logits[j]));
  m = team.max(m);
  float sum = 0.0f;
  for (int64_t j = team.rank(); j < vocab; j += team.size()) sum += expf(from_bf16(logits[j]) - m);
  sum = team.sum(sum);
  // Every member reads the target's logit before any member overwrites the row.
  const float target_logit = from_bf16(logits[target]);
  const double loss = static_cast<double>(m) + log(static_cast<double>(sum)) - target_logit;
  team.sync();
  if (grad) {
    const float scale = grad_scale / sum;
    for (int64_t j = team.rank(); j < vocab; j += team.size()) {
      const float g = expf(from_bf16(logits[j]) - m) * scale;
      logits[j] = to_bf16(j == target ? g - grad_scale : g);
    }
  }
  return loss;
}

}  // namespace titan::cuda_rows
