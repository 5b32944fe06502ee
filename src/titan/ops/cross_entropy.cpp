#include "titan/ops/cross_entropy.h"

#include <omp.h>
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

// -log softmax(row)[target] from a row of fp32 logits. With gradients the row becomes
// d loss / d logits * grad_scale in place: softmax * grad_scale, minus grad_scale at the target.
double row_loss(float* row, int32_t target, int64_t vocab, bool want_grad, float grad_scale,
                const VecKernels& v) {
  const float target_logit = row[target];
  const float m = v.max(row, vocab);
  const float sum = v.exp_shift_sum(row, row, vocab, m);
  if (want_grad) {
    v.scale(row, grad_scale / sum, vocab);
    row[target] -= grad_scale;
  }
  return static_cast<double>(m) + std::log(static_cast<double>(sum)) - target_logit;
}

}  // namespace

int64_t lm_head_chunk_tokens(int64_t n_tokens, int64_t vocab, int64_t chunk_tokens) {
  const int64_t budget_rows = kLogitsChunkBytes / (vocab * static_cast<int64_t>(sizeof(float)));
  const int64_t wanted =
      chunk_tokens > 0 ? chunk_tokens : std::max<int64_t>(64, budget_rows / 64 * 64);
  return std::max<int64_t>(1, std::min(wanted, n_tokens));
}

int64_t lm_head_workspace_bytes(int64_t n_tokens, int64_t vocab, int64_t chunk_tokens, bool bf16) {
  const int64_t chunk = lm_head_chunk_tokens(n_tokens, vocab, chunk_tokens);
  if (!bf16) return chunk * vocab * static_cast<int64_t>(sizeof(float));
  return (omp_get_max_threads() * static_cast<int64_t>(sizeof(float)) +
          chunk * static_cast<int64_t>(sizeof(uint16_t))) *
         vocab;
}

CrossEntropyResult lm_head_cross_entropy(const CrossEntropyArgs& a) {
  check_targets(a);
  const bool want_grad = a.dx != nullptr;
  const bool bf16 = a.weight_bf16 != nullptr;
  const int64_t chunk = lm_head_chunk_tokens(a.n_tokens, a.vocab, a.chunk_tokens);
  Buffer own_workspace;
  void* workspace = a.workspace;
  if (workspace == nullptr) {
    own_workspace = Buffer(
        static_cast<size_t>(lm_head_workspace_bytes(a.n_tokens, a.vocab, a.chunk_tokens, bf16)),
        MemCategory::activations);
    workspace = own_workspace.data();
  }
  // fp32: the chunk's logits. bf16: a row of fp32 per thread, into which each bf16 row of logits
  // is widened for its softmax, then the chunk's bf16 logits.
  auto* logits = static_cast<float*>(workspace);
  float* widened_rows = logits;
  auto* logits_bf16 = reinterpret_cast<uint16_t*>(widened_rows + omp_get_max_threads() * a.vocab);
  const size_t element = bf16 ? sizeof(uint16_t) : sizeof(float);
  if (bf16) {
    TITAN_CHECK(a.x_bf16 != nullptr, "cross-entropy: bf16 weights need room for x in bf16");
    convert_from_f32(a.x, static_cast<size_t>(a.n_tokens * a.hidden), DType::bf16, a.x_bf16);
  }
  std::vector<double> row_losses(a.n_tokens, 0.0);
  const VecKernels& v = backend().vec();
  for (int64_t n0 = 0; n0 < a.n_tokens; n0 += chunk) {
    const int64_t rows = std::min(chunk, a.n_tokens - n0);
    const float* x = a.x + n0 * a.hidden;
    const uint16_t* x_bf16 = bf16 ? a.x_bf16 + n0 * a.hidden : nullptr;
    if (bf16) {
      backend().gemm_bf16_to_bf16(Trans::no, Trans::yes, rows, a.vocab, a.hidden, 1.0f, x_bf16,
                                  a.hidden, a.weight_bf16, a.hidden, logits_bf16, a.vocab);
    } else {
      backend().gemm_f32(Trans::no, Trans::yes, rows, a.vocab, a.hidden, 1.0f, x, a.hidden,
                         a.weight, a.hidden, 0.0f, logits, a.vocab);
    }
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const auto vocab = static_cast<size_t>(a.vocab);
      uint16_t* row_bf16 = logits_bf16 + r * a.vocab;
      float* row = bf16 ? widened_rows + omp_get_thread_num() * a.vocab : logits + r * a.vocab;
      if (bf16) convert_to_f32(row_bf16, DType::bf16, vocab, row);
      if (a.logits != nullptr) {
        std::memcpy(a.logits + (n0 + r) * a.vocab, row, vocab * sizeof(float));
      }
      const int32_t target = a.targets[n0 + r];
      if (target == kIgnoreIndex) {
        if (want_grad) std::memset(bf16 ? static_cast<void*>(row_bf16) : row, 0, vocab * element);
        continue;
      }
      row_losses[n0 + r] = row_loss(row, target, a.vocab, want_grad, a.grad_scale, v);
      if (want_grad && bf16) convert_from_f32(row, vocab, DType::bf16, row_bf16);
    }
    if (want_grad && bf16) {
      backend().gemm_bf16(Trans::no, Trans::no, rows, a.hidden, a.vocab, 1.0f, logits_bf16, a.vocab,
                          a.weight_bf16, a.hidden, 0.0f, a.dx + n0 * a.hidden, a.hidden);
      backend().gemm_bf16(Trans::yes, Trans::no, a.vocab, a.hidden, rows, 1.0f, logits_bf16,
                          a.vocab, x_bf16, a.hidden, 1.0f, a.dweight, a.hidden);
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
    result.loss_sum += row_losses[n];
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
