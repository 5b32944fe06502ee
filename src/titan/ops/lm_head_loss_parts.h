// What the two lm_head losses share (ops/cross_entropy.cpp, over the whole vocabulary, and
// ops/cross_entropy_vocab_parallel.cpp, over a tensor-parallel rank's rows): a row's loss from its
// softmax statistics, the backward over vocabulary slices, and the loss summed over the scored
// tokens. Internal to ops/.
#pragma once

#include <omp.h>
#include <cmath>
#include <cstdint>
#include <cstring>

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
// rows under vocabulary parallel), from its d loss / d logits (rows, vocab): d x into a.dx's
// rows, d W accumulated into a.dweight unless it is null.
inline void lm_head_chunk_backward_f32(const CrossEntropyArgs& a, int64_t n0, int64_t rows,
                                       int64_t vocab, const float* gradient, float* dx_shares) {
  const float* x = a.x + n0 * a.hidden;
  lm_head_backward_by_slices(
      rows, a.hidden, vocab, a.dx + n0 * a.hidden, dx_shares,
      [&](int64_t v0, int64_t vn, float* dx, float beta) {
        backend().gemm_f32(Trans::no, Trans::no, rows, a.hidden, vn, 1.0f, gradient + v0, vocab,
                           a.weight + v0 * a.hidden, a.hidden, beta, dx, a.hidden);
        if (a.dweight == nullptr) return;
        backend().gemm_f32(Trans::yes, Trans::no, vn, a.hidden, rows, 1.0f, gradient + v0, vocab, x,
                           a.hidden, 1.0f, a.dweight + v0 * a.hidden, a.hidden);
      });
}
// The same over bf16 operands: the gradient (rows, ld) rounded, a.weight_bf16 and a.x_bf16.
inline void lm_head_chunk_backward_bf16(const CrossEntropyArgs& a, int64_t n0, int64_t rows,
                                        int64_t vocab, const uint16_t* gradient, int64_t ld,
                                        float* dx_shares) {
  const uint16_t* x_bf16 = a.x_bf16 + n0 * a.hidden;
  lm_head_backward_by_slices(
      rows, a.hidden, vocab, a.dx + n0 * a.hidden, dx_shares,
      [&](int64_t v0, int64_t vn, float* dx, float beta) {
        backend().gemm_bf16(Trans::no, Trans::no, rows, a.hidden, vn, 1.0f, gradient + v0, ld,
                            a.weight_bf16 + v0 * a.hidden, a.hidden, beta, dx, a.hidden);
        if (a.dweight == nullptr) return;
        backend().gemm_bf16(Trans::yes, Trans::no, vn, a.hidden, rows, 1.0f, gradient + v0, ld,
                            x_bf16, a.hidden, 1.0f, a.dweight + v0 * a.hidden, a.hidden);
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
