#include "titan/ops/cross_entropy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/backend/gemm_reference.h"
#include "titan/core/allocator.h"
#include "titan/core/error.h"
#include "titan/io/convert.h"

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

// row[0, n) as bf16 values in the row's first 2n bytes. Blocks of 64 are read whole before their
// bf16 values are written, and a block's output ends before the next block's input begins.
void round_row_to_bf16_in_place(float* row, int64_t n) {
  constexpr int64_t kBlock = 64;
  auto* out = reinterpret_cast<uint16_t*>(row);
  float block[kBlock];
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t count = std::min(kBlock, n - i);
    std::memcpy(block, row + i, static_cast<size_t>(count) * sizeof(float));
    for (int64_t j = 0; j < count; ++j) out[i + j] = f32_to_bf16(block[j]);
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
  const bool bf16 = a.weight_bf16 != nullptr;
  if (bf16) {
    TITAN_CHECK(a.x_bf16 != nullptr, "cross-entropy: bf16 weights need room for x in bf16");
    convert_from_f32(a.x, static_cast<size_t>(a.n_tokens * a.hidden), DType::bf16, a.x_bf16);
  }
  for (int64_t n0 = 0; n0 < a.n_tokens; n0 += chunk) {
    const int64_t rows = std::min(chunk, a.n_tokens - n0);
    const float* x = a.x + n0 * a.hidden;
    const uint16_t* x_bf16 = bf16 ? a.x_bf16 + n0 * a.hidden : nullptr;
    if (bf16) {
      backend().gemm_bf16(Trans::no, Trans::yes, rows, a.vocab, a.hidden, 1.0f, x_bf16, a.hidden,
                          a.weight_bf16, a.hidden, 0.0f, logits, a.vocab);
    } else {
      backend().gemm_f32(Trans::no, Trans::yes, rows, a.vocab, a.hidden, 1.0f, x, a.hidden,
                         a.weight, a.hidden, 0.0f, logits, a.vocab);
    }
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
        if (bf16) round_row_to_bf16_in_place(lr, a.vocab);
      }
    }
    if (want_grad && bf16) {
      // Each row's bf16 gradient sits in the first half of its fp32 row: a leading dimension of
      // 2V bf16 values.
      const auto* dlogits = reinterpret_cast<const uint16_t*>(logits);
      backend().gemm_bf16(Trans::no, Trans::no, rows, a.hidden, a.vocab, 1.0f, dlogits, 2 * a.vocab,
                          a.weight_bf16, a.hidden, 0.0f, a.dx + n0 * a.hidden, a.hidden);
      backend().gemm_bf16(Trans::yes, Trans::no, a.vocab, a.hidden, rows, 1.0f, dlogits,
                          2 * a.vocab, x_bf16, a.hidden, 1.0f, a.dweight, a.hidden);
    } else if (want_grad) {
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
