// One row of the lm_head loss (ops/cross_entropy.h's contract) over its fp32 logits, split over a
// team: the CUDA kernel (cross_entropy.cu) and the host test run this same code.
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

}  // namespace titan::cuda_rows
