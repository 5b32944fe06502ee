#include <omp.h>
#include <algorithm>
#include <cstring>
#include <vector>

#include "titan/backend/backend.h"
#include "titan/core/allocator.h"
#include "titan/core/dtype.h"
#include "titan/core/error.h"
#include "titan/ops/bf16_arrays.h"
#include "titan/ops/cross_entropy.h"
#include "titan/ops/lm_head_loss_parts.h"

namespace titan {
namespace {

void check_args(const CrossEntropyArgs& a, const VocabShard& shard) {
  TITAN_CHECK(a.n_tokens >= 0 && a.hidden > 0 && shard.rows > 0,
              "vocabulary-parallel cross-entropy: bad sizes (tokens ", a.n_tokens, ", hidden ",
              a.hidden, ", shard rows ", shard.rows, ")");
  TITAN_CHECK(a.vocab == shard.rows && shard.start >= 0 && shard.start + shard.rows <= shard.total,
              "vocabulary-parallel cross-entropy: the lm_head's ", a.vocab,
              " local rows are not the shard's rows [", shard.start, ", ", shard.start + shard.rows,
              ") of ", shard.total);
  TITAN_CHECK(shard.all_reduce_max && shard.all_reduce_sum,
              "vocabulary-parallel cross-entropy: the shard has no group reductions bound");
  TITAN_CHECK(a.dx != nullptr || a.dweight == nullptr,
              "vocabulary-parallel cross-entropy: dweight is requested only with dx");
  TITAN_CHECK(a.weight_bf16 == nullptr || a.x_bf16 != nullptr,
              "vocabulary-parallel cross-entropy: bf16 weights need room for x in bf16");
  for (int64_t n = 0; n < a.n_tokens; ++n) {
    const int32_t t = a.targets[n];
    TITAN_CHECK(t == kIgnoreIndex || (t >= 0 && t < shard.total),
                "vocabulary-parallel cross-entropy: target ", t, " at token ", n,
                " is outside [0, ", shard.total, ") and not the ignore index -100");
  }
}

// The target's column among this rank's rows, or -1 where another rank holds it (or the token
// is not scored).
int64_t local_target(int32_t target, const VocabShard& shard) {
  if (target == kIgnoreIndex) return -1;
  const int64_t column = target - shard.start;
  return column >= 0 && column < shard.rows ? column : -1;
}

// Per OpenMP thread in the bf16 form: one fp32 row for exp(logit - max), a 64-byte line apart
// for the next thread's.
int64_t exp_row_floats(int64_t rows) {
  return (rows + 15) / 16 * 16;
}

// One chunk's per-token statistics over the group, and the rows' losses. `logit(r)` is row r of
// this rank's logits (fp32 or bf16), `row_max(r)` its max and `exp_sum(r, max)` its sum of
// exp(logit - max) (the fp32 form writes the exps over the row, the bf16 form into the thread's
// row). stats holds 3 x rows floats: the max logits, then the sums and the target logits, whose
// reductions are one call.
template <typename RowMax, typename ExpSum, typename TargetLogit>
void chunk_statistics(const CrossEntropyArgs& a, const VocabShard& shard, int64_t n0, int64_t rows,
                      float* stats, double* row_losses, RowMax&& row_max, ExpSum&& exp_sum,
                      TargetLogit&& target_logit) {
  float* max = stats;
  float* sum = stats + rows;
  float* target = stats + 2 * rows;
  // Tokens not scored take part with zeros: every rank makes the same calls.
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    max[r] = a.targets[n0 + r] == kIgnoreIndex ? 0.0f : row_max(r);
  }
  shard.all_reduce_max(max, rows);
#pragma omp parallel for schedule(static)
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t t = a.targets[n0 + r];
    const int64_t column = local_target(t, shard);
    // Taken before exp_sum may overwrite the row.
    target[r] = column >= 0 ? target_logit(r, column) : 0.0f;
    sum[r] = t == kIgnoreIndex ? 0.0f : exp_sum(r, max[r]);
  }
  shard.all_reduce_sum(sum, 2 * rows);
  for (int64_t r = 0; r < rows; ++r) {
    if (a.targets[n0 + r] == kIgnoreIndex) continue;
    row_losses[n0 + r] = RowSoftmax{max[r], sum[r], target[r]}.loss();
  }
}

}  // namespace

int64_t lm_head_vocab_parallel_workspace_bytes(int64_t n_tokens, int64_t hidden,
                                               const VocabShard& shard, int64_t chunk_tokens,
                                               bool bf16) {
  const int64_t chunk = lm_head_chunk_tokens(n_tokens, shard.total, chunk_tokens);
  const int64_t shares = dx_shares_floats(chunk, hidden) * static_cast<int64_t>(sizeof(float));
  if (!bf16) return shares + chunk * shard.rows * static_cast<int64_t>(sizeof(float));
  return shares +
         omp_get_max_threads() * exp_row_floats(shard.rows) * static_cast<int64_t>(sizeof(float)) +
         chunk * shard.rows * static_cast<int64_t>(sizeof(uint16_t));
}

CrossEntropyResult lm_head_cross_entropy_vocab_parallel(const CrossEntropyArgs& a,
                                                        const VocabShard& shard) {
  check_args(a, shard);
  const bool want_grad = a.dx != nullptr;
  const bool bf16 = a.weight_bf16 != nullptr;
  const int64_t vocab = shard.rows;  // this rank's columns of the logits
  const auto row_bytes = static_cast<size_t>(vocab);
  const int64_t chunk = lm_head_chunk_tokens(a.n_tokens, shard.total, a.chunk_tokens);
  Buffer own_workspace;
  void* workspace = a.workspace;
  if (workspace == nullptr) {
    own_workspace = Buffer(backend().memory(),
                           static_cast<size_t>(lm_head_vocab_parallel_workspace_bytes(
                               a.n_tokens, a.hidden, shard, a.chunk_tokens, bf16)),
                           MemCategory::activations);
    workspace = own_workspace.data();
  }
  // The backward's shares of d x; then fp32: the chunk's logits, turned into d loss / d logits
  // in place. bf16: each thread's fp32 row, then the chunk's bf16 logits, likewise turned into
  // bf16 d loss / d logits in place (row by row, each row's exps first taken into the thread's
  // row).
  auto* dx_shares = static_cast<float*>(workspace);
  float* logits = dx_shares + dx_shares_floats(chunk, a.hidden);
  float* exp_rows = logits;
  auto* logits_bf16 =
      reinterpret_cast<uint16_t*>(exp_rows + omp_get_max_threads() * exp_row_floats(vocab));
  if (bf16) round_to_bf16(a.x_bf16, a.x, a.n_tokens * a.hidden);
  std::vector<double> row_losses(a.n_tokens, 0.0);
  std::vector<float> stats(static_cast<size_t>(3 * chunk));
  const VecKernels& v = backend().vec();
  for (int64_t n0 = 0; n0 < a.n_tokens; n0 += chunk) {
    const int64_t rows = std::min(chunk, a.n_tokens - n0);
    const float* x = a.x + n0 * a.hidden;
    const float* max = stats.data();
    const float* sum = stats.data() + rows;
    if (bf16) {
      const uint16_t* x_bf16 = a.x_bf16 + n0 * a.hidden;
      backend().gemm_bf16_to_bf16(Trans::no, Trans::yes, rows, vocab, a.hidden, 1.0f, x_bf16,
                                  a.hidden, a.weight_bf16, a.hidden, logits_bf16, vocab);
      if (a.logits != nullptr) {
        for (int64_t r = 0; r < rows; ++r) {
          v.widen_bf16(a.logits + (n0 + r) * vocab, logits_bf16 + r * vocab, vocab);
        }
      }
      const auto thread_exp_row = [&] {
        return exp_rows + omp_get_thread_num() * exp_row_floats(vocab);
      };
      chunk_statistics(
          a, shard, n0, rows, stats.data(), row_losses.data(),
          [&](int64_t r) { return v.max_bf16(logits_bf16 + r * vocab, vocab); },
          [&](int64_t r, float m) {
            return v.exp_shift_sum_bf16(thread_exp_row(), logits_bf16 + r * vocab, vocab, m);
          },
          [&](int64_t r, int64_t column) { return bf16_to_f32(logits_bf16[r * vocab + column]); });
      if (!want_grad) continue;
#pragma omp parallel for schedule(static)
      for (int64_t r = 0; r < rows; ++r) {
        uint16_t* row = logits_bf16 + r * vocab;
        const int32_t t = a.targets[n0 + r];
        if (t == kIgnoreIndex) {
          std::memset(row, 0, row_bytes * sizeof(uint16_t));
          continue;
        }
        // The exps again (the statistics pass kept only their sum), then scaled and rounded in
        // one pass over the logits they came from; the target's element, which also subtracts
        // grad_scale, rounded again from its fp32 value.
        float* exp_row = thread_exp_row();
        v.exp_shift_sum_bf16(exp_row, row, vocab, max[r]);
        const float scale = a.grad_scale / sum[r];
        v.round_to_bf16(row, exp_row, scale, vocab);
        const int64_t column = local_target(t, shard);
        if (column >= 0) row[column] = f32_to_bf16(exp_row[column] * scale - a.grad_scale);
      }
      lm_head_chunk_backward(a, n0, rows, vocab, logits_bf16, vocab, dx_shares);
      continue;
    }
    backend().gemm_f32(Trans::no, Trans::yes, rows, vocab, a.hidden, 1.0f, x, a.hidden, a.weight,
                       a.hidden, 0.0f, logits, vocab);
    if (a.logits != nullptr) {
      std::memcpy(a.logits + n0 * vocab, logits,
                  static_cast<size_t>(rows) * row_bytes * sizeof(float));
    }
    chunk_statistics(
        a, shard, n0, rows, stats.data(), row_losses.data(),
        [&](int64_t r) { return v.max(logits + r * vocab, vocab); },
        [&](int64_t r, float m) {
          float* row = logits + r * vocab;
          return v.exp_shift_sum(row, row, vocab, m);
        },
        [&](int64_t r, int64_t column) { return logits[r * vocab + column]; });
    if (!want_grad) continue;
#pragma omp parallel for schedule(static)
    for (int64_t r = 0; r < rows; ++r) {
      float* row = logits + r * vocab;  // exp(logit - max), from the statistics pass
      const int32_t t = a.targets[n0 + r];
      if (t == kIgnoreIndex) {
        std::memset(row, 0, row_bytes * sizeof(float));
        continue;
      }
      v.scale(row, a.grad_scale / sum[r], vocab);
      const int64_t column = local_target(t, shard);
      if (column >= 0) row[column] -= a.grad_scale;
    }
    lm_head_chunk_backward(a, n0, rows, vocab, logits, vocab, dx_shares);
  }
  return sum_scored_losses(a, row_losses.data());
}

}  // namespace titan
