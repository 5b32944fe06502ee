#include "titan/ops/cross_entropy.h"

#include <omp.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/backend/gemm_reference.h"
#include "titan/core/allocator.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/ops/bf16_arrays.h"
#include "titan/ops/lm_head_loss_parts.h"

namespace titan {
namespace {

void check_targets(const CrossEntropyArgs& a) {
  TITAN_CHECK(a.n_tokens >= 0 && a.hidden > 0 && a.vocab > 0, "cross-entropy: bad sizes (tokens ",
              a.n_tokens, ", hidden ", a.hidden, ", vocab ", a.vocab, ")");
  TITAN_CHECK(a.dx != nullptr || a.dweight == nullptr,
              "cross-entropy: dweight is requested only with dx");
  for (int64_t n = 0; n < a.n_tokens; ++n) {
    const int32_t t = a.targets[n];
    TITAN_CHECK(t == kIgnoreIndex || (t >= 0 && t < a.vocab), "cross-entropy: target ", t,
                " at token ", n, " is outside [0, ", a.vocab, ") and not the ignore index -100");
  }
}

// A row of fp32 logits becomes exp(logit - max) in place (RowSoftmax, ops/lm_head_loss_parts.h),
// the target's logit taken before the row is overwritten.
RowSoftmax exp_shifted_in_place(float* row, int32_t target, int64_t vocab, const VecKernels& v) {
  const float target_logit = row[target];
  const float m = v.max(row, vocab);
  return {m, v.exp_shift_sum(row, row, vocab, m), target_logit};
}

// The leading dimension of a bf16 chunk's d loss / d logits: rows an odd number of 64-byte lines
// apart, so the d weight GEMM's reads down a column (one element per row) spread over every cache
// set. Qwen3's 151,936 values are 4,748 lines, an even number, and at that stride the GEMM ran
// 15-20 % slower. Unpadded when the padding of every row together would exceed one row (a small
// vocabulary in a tall chunk): bf16_softmax_rows' in-place layout needs it within one.
int64_t bf16_gradient_ld(int64_t rows, int64_t vocab) {
  const int64_t lines = (vocab * static_cast<int64_t>(sizeof(uint16_t)) + 63) / 64;
  const int64_t ld = (lines | 1) * 32;
  return rows * (ld - vocab) <= vocab ? ld : vocab;
}

// Per OpenMP thread, bf16_softmax_rows' room: one fp32 row for exp(logit - max), then one bf16
// row, in floats, a 64-byte line apart for the next thread's.
int64_t bf16_row_scratch_floats(int64_t vocab) {
  return (vocab + (vocab + 1) / 2 + 15) / 16 * 16;
}

// One chunk's bf16 logits (rows, V) at `logits` (dense, as the GEMM wrote them) to the rows'
// losses and, with gradients, d loss / d logits in bf16 at `gradient` with leading dimension
// `ld`. `logits` is gradient + rows * (ld - V): row r's gradient [r ld, r ld + V) then overlaps
// the logits of rows r - 1 and r only, so each thread walks its rows in order, and every thread
// copies its last row's logits aside before the barrier after which the next thread writes over
// them. A row's max and exp are taken from its bf16 logits (widened in registers; no fp32 copy
// of the logits is made), exp(logit - max) into the thread's fp32 row (`row_scratch`,
// bf16_row_scratch_floats per thread), which is then scaled and rounded into the gradient.
void bf16_softmax_rows(const CrossEntropyArgs& a, int64_t n0, int64_t rows, const uint16_t* logits,
                       uint16_t* gradient, int64_t ld, float* row_scratch, double* row_losses) {
  const bool want_grad = a.dx != nullptr;
  const auto vocab = static_cast<size_t>(a.vocab);
  const VecKernels& v = backend().vec();
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t begin = rows * t / threads, end = rows * (t + 1) / threads;
    float* exp_row = row_scratch + t * bf16_row_scratch_floats(a.vocab);
    auto* last_logits = reinterpret_cast<uint16_t*>(exp_row + a.vocab);
    if (end > begin) {
      std::memcpy(last_logits, logits + (end - 1) * a.vocab, vocab * sizeof(uint16_t));
    }
#pragma omp barrier
    for (int64_t r = begin; r < end; ++r) {
      const uint16_t* row = r + 1 == end ? last_logits : logits + r * a.vocab;
      if (a.logits != nullptr) v.widen_bf16(a.logits + (n0 + r) * a.vocab, row, a.vocab);
      const int32_t target = a.targets[n0 + r];
      uint16_t* gradient_row = gradient + r * ld;
      if (target == kIgnoreIndex) {
        if (want_grad) std::memset(gradient_row, 0, vocab * sizeof(uint16_t));
        continue;
      }
      const float m = v.max_bf16(row, a.vocab);
      const RowSoftmax softmax{m, v.exp_shift_sum_bf16(exp_row, row, a.vocab, m),
                               bf16_to_f32(row[target])};
      row_losses[n0 + r] = softmax.loss();
      if (want_grad) {
        // Scaled and rounded in one pass; then the target's element, which also subtracts
        // grad_scale, is rounded again from its fp32 value.
        const float scale = a.grad_scale / softmax.sum;
        v.round_to_bf16(gradient_row, exp_row, scale, a.vocab);
        const float target_gradient = exp_row[target] * scale;
        gradient_row[target] = f32_to_bf16(target_gradient - a.grad_scale);
      }
    }
  }
}

}  // namespace

int64_t lm_head_chunk_tokens(int64_t n_tokens, int64_t vocab, int64_t chunk_tokens) {
  const int64_t budget_rows = kLogitsChunkBytes / (vocab * static_cast<int64_t>(sizeof(float)));
  const int64_t wanted =
      chunk_tokens > 0 ? chunk_tokens : std::max<int64_t>(64, budget_rows / 64 * 64);
  return std::max<int64_t>(1, std::min(wanted, n_tokens));
}

int64_t lm_head_workspace_bytes(int64_t n_tokens, int64_t hidden, int64_t vocab,
                                int64_t chunk_tokens, bool bf16) {
  const int64_t chunk = lm_head_chunk_tokens(n_tokens, vocab, chunk_tokens);
  const int64_t shares = dx_shares_floats(chunk, hidden) * static_cast<int64_t>(sizeof(float));
  if (!bf16) return shares + chunk * vocab * static_cast<int64_t>(sizeof(float));
  return shares +
         omp_get_max_threads() * bf16_row_scratch_floats(vocab) *
             static_cast<int64_t>(sizeof(float)) +
         chunk * bf16_gradient_ld(chunk, vocab) * static_cast<int64_t>(sizeof(uint16_t));
}

CrossEntropyResult lm_head_cross_entropy(const CrossEntropyArgs& a) {
  check_targets(a);
  const bool want_grad = a.dx != nullptr;
  const bool bf16 = a.weight_bf16 != nullptr;
  const int64_t chunk = lm_head_chunk_tokens(a.n_tokens, a.vocab, a.chunk_tokens);
  Buffer own_workspace;
  void* workspace = a.workspace;
  if (workspace == nullptr) {
    own_workspace = Buffer(backend().memory(),
                           static_cast<size_t>(lm_head_workspace_bytes(
                               a.n_tokens, a.hidden, a.vocab, a.chunk_tokens, bf16)),
                           MemCategory::activations);
    workspace = own_workspace.data();
  }
  // The backward's shares of d x (lm_head_backward_by_slices); then fp32: the chunk's logits.
  // bf16: each thread's rows for its softmax, then the chunk's bf16 logits and gradients
  // (bf16_softmax_rows).
  auto* dx_shares = static_cast<float*>(workspace);
  float* logits = dx_shares + dx_shares_floats(chunk, a.hidden);
  float* softmax_rows = logits;
  auto* gradient_bf16 = reinterpret_cast<uint16_t*>(
      softmax_rows + omp_get_max_threads() * bf16_row_scratch_floats(a.vocab));
  if (bf16) {
    TITAN_CHECK(a.x_bf16 != nullptr, "cross-entropy: bf16 weights need room for x in bf16");
    round_to_bf16(a.x_bf16, a.x, a.n_tokens * a.hidden);
  }
  std::vector<double> row_losses(a.n_tokens, 0.0);
  const VecKernels& v = backend().vec();
  for (int64_t n0 = 0; n0 < a.n_tokens; n0 += chunk) {
    const int64_t rows = std::min(chunk, a.n_tokens - n0);
    const float* x = a.x + n0 * a.hidden;
    const uint16_t* x_bf16 = bf16 ? a.x_bf16 + n0 * a.hidden : nullptr;
    if (bf16) {
      const int64_t ld = bf16_gradient_ld(rows, a.vocab);
      uint16_t* logits_bf16 = gradient_bf16 + rows * (ld - a.vocab);
      backend().gemm_bf16_to_bf16(Trans::no, Trans::yes, rows, a.vocab, a.hidden, 1.0f, x_bf16,
                                  a.hidden, a.weight_bf16, a.hidden, logits_bf16, a.vocab);
      bf16_softmax_rows(a, n0, rows, logits_bf16, gradient_bf16, ld, softmax_rows,
                        row_losses.data());
      if (want_grad) {
        lm_head_chunk_backward(a, n0, rows, a.vocab, gradient_bf16, ld, dx_shares);
      }
      continue;
    }
    backend().gemm_f32(Trans::no, Trans::yes, rows, a.vocab, a.hidden, 1.0f, x, a.hidden, a.weight,
                       a.hidden, 0.0f, logits, a.vocab);
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      const auto vocab = static_cast<size_t>(a.vocab);
      float* row = logits + r * a.vocab;
      if (a.logits != nullptr) {
        std::memcpy(a.logits + (n0 + r) * a.vocab, row, vocab * sizeof(float));
      }
      const int32_t target = a.targets[n0 + r];
      if (target == kIgnoreIndex) {
        if (want_grad) std::memset(row, 0, vocab * sizeof(float));
        continue;
      }
      const RowSoftmax softmax = exp_shifted_in_place(row, target, a.vocab, v);
      row_losses[n0 + r] = softmax.loss();
      if (want_grad) {
        v.scale(row, a.grad_scale / softmax.sum, a.vocab);
        row[target] -= a.grad_scale;
      }
    }
    if (want_grad) {
      lm_head_chunk_backward(a, n0, rows, a.vocab, logits, a.vocab, dx_shares);
    }
  }
  return sum_scored_losses(a, row_losses.data());
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
    if (a.dweight != nullptr) {
      gemm_f32_reference(Trans::yes, Trans::no, a.vocab, a.hidden, a.n_tokens, 1.0f, dlogits.data(),
                         a.vocab, a.x, a.hidden, 1.0f, a.dweight, a.hidden);
    }
  }
  return result;
}

}  // namespace titan
