#include "titan/ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/backend/gemm_reference.h"
#include "titan/core/allocator.h"
#include "titan/core/error.h"

namespace titan {
namespace {

void check_targets(const CrossEntropyArgs& a) {
  TITAN_CHECK(a.n_tokens >= 0 && a.hidden > 0 && a.vocab > 0, "cross-entropy: bad sizes (tokens ",
              a.n_tokens, ", hidden ", a.hidden, ", vocab ", a.vocab, ")");
  TITAN_CHECK((a.dx == nullptr) == (a.dweight == nullptr),
              "cross-entropy: dx and dweight are requested together");
  for (int64_t n = 0; n < a.n_tokens; ++n) {
    const int32_t t = a.targets[n];
    TITAN_CHECK(t == kIgnoreIndex || (t >= 0 && t < a.vocab), "cross-entropy: target ", t,
                " at token ", n, " is outside [0, ", a.vocab, ") and not the ignore index -100");
  }
}

}  // namespace

int64_t lm_head_chunk_tokens(int64_t n_tokens, int64_t vocab, int64_t chunk_tokens) {
  const int64_t budget_rows = kLogitsChunkBytes / (vocab * static_cast<int64_t>(sizeof(float)));
  const int64_t wanted =
      chunk_tokens > 0 ? chunk_tokens : std::max<int64_t>(64, budget_rows / 64 * 64);
  return std::max<int64_t>(1, std::min(wanted, n_tokens));
}

CrossEntropyResult lm_head_cross_entropy(const CrossEntropyArgs& a) {
  check_targets(a);
  const bool want_grad = a.dx != nullptr;
  const int64_t chunk = lm_head_chunk_tokens(a.n_tokens, a.vocab, a.chunk_tokens);
  Buffer own_logits;
  float* logits = a.workspace;
  if (logits == nullptr) {
    own_logits =
        Buffer(static_cast<size_t>(chunk * a.vocab) * sizeof(float), MemCategory::activations);
    logits = own_logits.as<float>();
  }
  std::vector<double> row_loss(a.n_tokens, 0.0);
  const VecKernels& v = backend().vec();
  for (int64_t n0 = 0; n0 < a.n_tokens; n0 += chunk) {
    const int64_t rows = std::min(chunk, a.n_tokens - n0);
    const float* x = a.x + n0 * a.hidden;
    backend().gemm_f32(Trans::no, Trans::yes, rows, a.vocab, a.hidden, 1.0f, x, a.hidden, a.weight,
                       a.hidden, 0.0f, logits, a.vocab);
    if (a.logits != nullptr) {
      std::memcpy(a.logits + n0 * a.vocab, logits, rows * a.vocab * sizeof(float));
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* lr = logits + r * a.vocab;
      const int32_t target = a.targets[n0 + r];
      if (target == kIgnoreIndex) {
        if (want_grad) std::memset(lr, 0, a.vocab * sizeof(float));
        continue;
      }
      const float target_logit = lr[target];
      const float m = v.max(lr, a.vocab);
      // With gradients the exponentials are kept in place: they become softmax * grad_scale.
      float* exps = lr;
      const float sum = v.exp_shift_sum(exps, lr, a.vocab, m);
      row_loss[n0 + r] = static_cast<double>(m) + std::log(static_cast<double>(sum)) - target_logit;
      if (want_grad) {
        v.scale(exps, a.grad_scale / sum, a.vocab);
        exps[target] -= a.grad_scale;
      }
    }
    if (want_grad) {
      backend().gemm_f32(Trans::no, Trans::no, rows, a.hidden, a.vocab, 1.0f, logits, a.vocab,
                         a.weight, a.hidden, 0.0f, a.dx + n0 * a.hidden, a.hidden);
      backend().gemm_f32(Trans::yes, Trans::no, a.vocab, a.hidden, rows, 1.0f, logits, a.vocab, x,
                         a.hidden, 1.0f, a.dweight, a.hidden);
    }
  }
  CrossEntropyResult result;
  for (int64_t n = 0; n < a.n_tokens; ++n) {
    if (a.targets[n] == kIgnoreIndex) continue;
    result.loss_sum += row_loss[n];
    ++result.n_scored;
  }
  return result;
}

CrossEntropyResult lm_head_cross_entropy_reference(const CrossEntropyArgs& a) {
  check_targets(a);
  std::vector<float> logits(static_cast<size_t>(a.n_tokens * a.vocab));
  gemm_f32_reference(Trans::no, Trans::yes, a.n_tokens, a.vocab, a.hidden, 1.0f, a.x, a.hidden,
                     a.weight, a.hidden, 0.0f, logits.data(), a.vocab);
  if (a.logits != nullptr) std::copy(logits.begin(), logits.end(), a.logits);
  CrossEntropyResult result;
  std::vector<float> dlogits(logits.size(), 0.0f);
  for (int64_t n = 0; n < a.n_tokens; ++n) {
    const int32_t target = a.targets[n];
    if (target == kIgnoreIndex) continue;
    const float* lr = logits.data() + n * a.vocab;
    const double m = *std::max_element(lr, lr + a.vocab);
    double sum = 0.0;
    for (int64_t j = 0; j < a.vocab; ++j) sum += std::exp(lr[j] - m);
    result.loss_sum += m + std::log(sum) - lr[target];
    ++result.n_scored;
    for (int64_t j = 0; j < a.vocab; ++j) {
      dlogits[n * a.vocab + j] = static_cast<float>(std::exp(lr[j] - m) / sum * a.grad_scale -
                                                    (j == target ? a.grad_scale : 0.0));
    }
  }
  if (a.dx != nullptr) {
    gemm_f32_reference(Trans::no, Trans::no, a.n_tokens, a.hidden, a.vocab, 1.0f, dlogits.data(),
                       a.vocab, a.weight, a.hidden, 0.0f, a.dx, a.hidden);
    gemm_f32_reference(Trans::yes, Trans::no, a.vocab, a.hidden, a.n_tokens, 1.0f, dlogits.data(),
                       a.vocab, a.x, a.hidden, 1.0f, a.dweight, a.hidden);
  }
  return result;
}

}  // namespace titan
