// `titan verify-kernels` on the vocabulary-parallel forms (tensor parallel: ops/vocab_shard.h):
// the ranks of 2- and 3-way groups as threads of this process (dispatch/thread_group.h), their
// parts put together -- outputs and d x summed over the ranks, d weight rows concatenated --
// against the op's fp32 reference over the whole vocabulary.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "titan/core/rng.h"
#include "titan/dispatch/thread_group.h"
#include "titan/dispatch/verify_checks.h"

namespace titan::verify_checks {
namespace {

// Rows [shard.start, shard.start + shard.rows) of a (total, dim) matrix.
template <typename T>
std::vector<T> shard_rows(const std::vector<T>& whole, const VocabShard& shard, int64_t dim) {
  return {whole.begin() + shard.start * dim, whole.begin() + (shard.start + shard.rows) * dim};
}

}  // namespace

void verify_embedding_vocab_parallel(const EmbeddingKernel& k, Checks& c) {
  const int64_t vocab = 60, dim = 64, n = 96;
  const std::vector<float> weight = uniform(vocab * dim, 1), dout = uniform(n * dim, 3),
                           dweight0 = uniform(vocab * dim, 4);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  Rng rng(2, "verify-kernels ids");
  for (int32_t& id : ids) id = static_cast<int32_t>(rng.next_u64() % vocab);
  std::vector<float> want(static_cast<size_t>(n * dim));
  for (int64_t t = 0; t < n; ++t) std::copy_n(weight.begin() + ids[t] * dim, dim, &want[t * dim]);
  std::vector<double> sums(dweight0.begin(), dweight0.end());
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < dim; ++j) sums[ids[t] * dim + j] += dout[t * dim + j];
  }
  for (const int degree : {2, 3}) {
    const std::string form = "vocab_parallel_" + std::to_string(degree);
    std::vector<float> out(want.size(), 0.0f), dweight;
    std::vector<std::vector<float>> outs(static_cast<size_t>(degree));
    for (int rank = 0; rank < degree; ++rank) {
      // The lookup needs no reduction: the ranks run one after another.
      const VocabShard shard = VocabShard::of(vocab, rank, degree);
      const std::vector<float> local = shard_rows(weight, shard, dim);
      std::vector<float> part(want.size());
      k.forward_vocab_parallel(part.data(), ids.data(), local.data(), n, shard, dim);
      for (size_t i = 0; i < out.size(); ++i) out[i] += part[i];
      std::vector<float> local_dweight = shard_rows(dweight0, shard, dim);
      k.backward_vocab_parallel(local_dweight.data(), dout.data(), ids.data(), n, shard, dim);
      dweight.insert(dweight.end(), local_dweight.begin(), local_dweight.end());
    }
    // One rank holds each id's row, the others add zeros: the sum is the row exactly.
    c.add(form + ".forward", "out", out, want, 0.0);
    c.add(form + ".backward", "dweight", dweight, std::vector<float>(sums.begin(), sums.end()),
          fp32_tolerance(n));
  }
}

void verify_lm_head_loss_vocab_parallel(const LmHeadLossKernel& k, bool takes_bf16, Checks& c) {
  const LmHeadLossInputs in;
  const int64_t n = in.n, hidden = in.hidden, vocab = in.vocab;
  const float grad_scale = 1.0f / (n - 1);
  // The whole vocabulary through the reference, on `x_in` and `w_in`.
  const auto reference = [&](const float* x_in, const float* w_in, std::vector<float>& dx,
                             std::vector<float>& dweight) {
    CrossEntropyArgs a;
    a.x = x_in, a.weight = w_in, a.targets = in.targets.data();
    a.n_tokens = n, a.hidden = hidden, a.vocab = vocab;
    dx.assign(static_cast<size_t>(n * hidden), 0.0f);
    dweight = in.dweight0;
    a.dx = dx.data(), a.dweight = dweight.data(), a.grad_scale = grad_scale;
    return static_cast<float>(lm_head_cross_entropy_reference(a).loss_sum);
  };
  // The kernel's vocabulary-parallel form on `degree` ranks: every rank's loss, d x summed over
  // the ranks, d weight's rows concatenated.
  const auto parallel = [&](int degree, bool bf16, std::vector<float>& losses,
                            std::vector<float>& dx, std::vector<float>& dweight) {
    const std::vector<uint16_t> weight16 = bf16 ? rounded(in.weight) : std::vector<uint16_t>{};
    std::vector<std::vector<float>> dxs(static_cast<size_t>(degree)),
        dweights(static_cast<size_t>(degree));
    losses.assign(static_cast<size_t>(degree), 0.0f);
    run_vocab_ranks_in_threads(vocab, degree, [&](const VocabShard& shard) {
      const int rank = static_cast<int>(shard.start / shard.rows);
      const std::vector<float> local = shard_rows(in.weight, shard, hidden);
      const std::vector<uint16_t> local16 =
          bf16 ? shard_rows(weight16, shard, hidden) : std::vector<uint16_t>{};
      std::vector<uint16_t> x16(bf16 ? static_cast<size_t>(n * hidden) : 0);
      dxs[rank].assign(static_cast<size_t>(n * hidden), 0.0f);
      dweights[rank] = shard_rows(in.dweight0, shard, hidden);
      CrossEntropyArgs a;
      a.x = in.x.data(), a.weight = local.data(), a.targets = in.targets.data();
      a.weight_bf16 = bf16 ? local16.data() : nullptr, a.x_bf16 = bf16 ? x16.data() : nullptr;
      a.n_tokens = n, a.hidden = hidden, a.vocab = shard.rows;
      a.dx = dxs[rank].data(), a.dweight = dweights[rank].data(), a.grad_scale = grad_scale;
      a.chunk_tokens = 7;  // several chunks, the last one short
      losses[rank] = static_cast<float>(k.forward_backward_vocab_parallel(a, shard).loss_sum);
    });
    dx.assign(static_cast<size_t>(n * hidden), 0.0f);
    dweight.clear();
    for (int rank = 0; rank < degree; ++rank) {
      for (size_t i = 0; i < dx.size(); ++i) dx[i] += dxs[rank][i];
      dweight.insert(dweight.end(), dweights[rank].begin(), dweights[rank].end());
    }
  };
  std::vector<float> want_dx, want_dweight, losses, dx, dweight;
  const float want_loss = reference(in.x.data(), in.weight.data(), want_dx, want_dweight);
  const std::vector<float> x_grid = on_bf16_grid(in.x), w_grid = on_bf16_grid(in.weight);
  std::vector<float> want16_dx, want16_dweight;
  const float want16_loss = reference(x_grid.data(), w_grid.data(), want16_dx, want16_dweight);
  const double tolerance = fp32_tolerance(std::max({vocab, hidden, n}));
  for (const int degree : {2, 3}) {
    const std::string form = "vocab_parallel_" + std::to_string(degree);
    parallel(degree, false, losses, dx, dweight);
    add_lm_head_loss_checks(c, form, losses, want_loss, dx, want_dx, dweight, want_dweight,
                            tolerance);
    if (!takes_bf16) continue;
    // bf16 GEMMs and logits: against the reference on the bf16 operands' values.
    parallel(degree, true, losses, dx, dweight);
    add_lm_head_loss_checks(c, form + ".bf16", losses, want16_loss, dx, want16_dx, dweight,
                            want16_dweight, kBf16Tolerance);
  }
}

}  // namespace titan::verify_checks
