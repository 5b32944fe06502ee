// What the two lm_head losses share (ops/cross_entropy.cpp, over the whole vocabulary, and
// ops/cross_entropy_vocab_parallel.cpp, over a tensor-parallel rank's rows): a row's loss from its
// softmax statistics, the backward over vocabulary slices, and the loss summed over the scored
// tokens. Internal to ops/.
#pragma once

#include <omp.h>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "titan/backend/backend.h"
#include "titan/ops/cross_entropy.h"

namespace titan {

// A row's softmax statistics: its max logit, the sum of exp(logit - max) and the target's logit.
// The row's loss, -log softmax[target], is max + log(sum) - the target's logit, and
// d loss / d logits * grad_scale is exp(logit - max) * (grad_scale / sum), minus grad_scale at
// the target.
struct RowSoftmax {
  float max, sum, target_logit;
  double loss() const {
    return static_cast<double>(max) + std::log(static_cast<double>(sum)) - target_logit;
  }
};

// The floats of lm_head_backward_by_slices' shares of d x for a chunk: one (rows, h) share per
// OpenMP thread but the first, rounded up to a 64-byte line.
inline int64_t dx_shares_floats(int64_t rows, int64_t hidden) {
  return ((omp_get_max_threads() - 1) * rows * hidden + 15) / 16 * 16;
}

// Vocabulary rows per slice of the backward's GEMMs (lm_head_backward_by_slices), at most: a
// slice's bf16 W and d loss / d logits columns (4 MB together for a 512-token chunk at hidden
// 512) stay in a core's L2 between its two GEMMs.
constexpr int64_t kVocabSliceRows = 4096;

// d x (rows, h) = G W and d W (V, h) += G^T x for one chunk's d loss / d logits G (rows, V), over
// slices of the vocabulary, each thread taking a run of whole slices and both GEMMs of each on
// its own (`slice_gemms(first vocab row, vocab rows, d x target, beta)`): a slice's columns of G
// and rows of W are read from memory once for both products, where two GEMMs over the whole
// vocabulary stream G (155 MB a chunk in bf16) twice and read W, d W and G through packing
// copies. Thread t's share of d x goes to dx itself (t = 0) or to its row of `dx_shares`
// ((threads - 1) x rows x h floats), and the shares are summed into dx at the end.
template <typename SliceGemms>
void lm_head_backward_by_slices(int64_t rows, int64_t hidden, int64_t vocab, float* dx,
                                float* dx_shares, SliceGemms&& slice_gemms) {
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t per_thread =
        (vocab + threads * kVocabSliceRows - 1) / (threads * kVocabSliceRows);
    const int64_t slices = threads * per_thread;
    float* share = t == 0 ? dx : dx_shares + (t - 1) * rows * hidden;
    float beta = 0.0f;
    for (int64_t i = t * per_thread; i < (t + 1) * per_thread; ++i) {
      const int64_t begin = vocab * i / slices, end = vocab * (i + 1) / slices;
      if (end == begin) continue;
      slice_gemms(begin, end - begin, share, beta);
      beta = 1.0f;
    }
    if (beta == 0.0f) std::memset(share, 0, static_cast<size_t>(rows * hidden) * sizeof(float));
#pragma omp barrier
#pragma omp for schedule(static)
    for (int64_t e = 0; e < rows * hidden; ++e) {
      float sum = dx[e];
      for (int64_t u = 1; u < threads; ++u) sum += dx_shares[(u - 1) * rows * hidden + e];
      dx[e] = sum;
    }
  }
}

// One chunk's backward, `rows` tokens from n0 over `vocab` lm_head rows (a.weight's, a rank's
// rows under vocabulary parallel), from its d loss / d logits (rows, ld): d x into a.dx's rows,
// d W accumulated into a.dweight unless it is null. T float: fp32 GEMMs over a.weight and a.x;
// uint16_t: bf16 GEMMs over the rounded gradient, a.weight_bf16 and a.x_bf16.
template <typename T>
void lm_head_chunk_backward(const CrossEntropyArgs& a, int64_t n0, int64_t rows, int64_t vocab,
                            const T* gradient, int64_t ld, float* dx_shares) {
  constexpr bool bf16 = std::is_same_v<T, uint16_t>;
  const T* weight;
  const T* x;
  if constexpr (bf16) {
    weight = a.weight_bf16, x = a.x_bf16 + n0 * a.hidden;
  } else {
    weight = a.weight, x = a.x + n0 * a.hidden;
  }
  const auto gemm = [](Trans ta, Trans tb, int64_t m, int64_t n, int64_t k, const T* lhs,
                       int64_t ld_lhs, const T* rhs, int64_t ld_rhs, float beta, float* out,
                       int64_t ld_out) {
    if constexpr (bf16) {
      backend().gemm_bf16(ta, tb, m, n, k, 1.0f, lhs, ld_lhs, rhs, ld_rhs, beta, out, ld_out);
    } else {
      backend().gemm_f32(ta, tb, m, n, k, 1.0f, lhs, ld_lhs, rhs, ld_rhs, beta, out, ld_out);
    }
  };
  lm_head_backward_by_slices(rows, a.hidden, vocab, a.dx + n0 * a.hidden, dx_shares,
                             [&](int64_t v0, int64_t vn, float* dx, float beta) {
                               gemm(Trans::no, Trans::no, rows, a.hidden, vn, gradient + v0, ld,
                                    weight + v0 * a.hidden, a.hidden, beta, dx, a.hidden);
                               if (a.dweight == nullptr) return;
                               gemm(Trans::yes, Trans::no, vn, a.hidden, rows, gradient + v0, ld, x,
                                    a.hidden, 1.0f, a.dweight + v0 * a.hidden, a.hidden);
                             });
}

// The loss summed over the scored tokens (targets not kIgnoreIndex), row_losses (N) in order.
inline CrossEntropyResult sum_scored_losses(const CrossEntropyArgs& a, const double* row_losses) {
  CrossEntropyResult result;
  for (int64_t n = 0; n < a.n_tokens; ++n) {
    if (a.targets[n] == kIgnoreIndex) continue;
    result.loss_sum += row_losses[n];
    ++result.n_scored;
  }
  return result;
}

}  // namespace titan
