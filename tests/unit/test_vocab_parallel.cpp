// The vocabulary-parallel embedding and cross-entropy (ops/vocab_shard.h; tensor parallel's
// vocabulary cut) against the whole-vocabulary ops they replace: embedding_forward / _backward
// and the chunked lm_head_cross_entropy. Their ranks run as threads of this process (2- and
// 3-way groups, dispatch/thread_group.h) and, under mpirun (tests/CMakeLists.txt runs this binary
// alone and on 2 ranks), as the MPI world's ranks with the shards' reductions on the world's
// communicator. The parts are put together as tensor parallel will: the lookups and d x summed
// over the group, the d weight rows concatenated.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "titan/core/error.h"
#include "titan/core/rng.h"
#include "titan/dispatch/thread_group.h"
#include "titan/dispatch/verify_checks.h"
#include "titan/distributed/world.h"
#include "titan/ops/cross_entropy.h"
#include "titan/ops/embedding.h"
#include "unit/compare.h"

namespace titan {
namespace {

using testing::expect_close;
using verify_checks::fp32_tolerance;
using verify_checks::kBf16Tolerance;
using verify_checks::rounded;
using verify_checks::uniform;

constexpr int64_t kTokens = 40, kHidden = 48, kVocab = 96;  // 96: divides over 2 and 3 ranks
constexpr int64_t kChunk = 16;                              // three chunks, the last one short
constexpr float kGradScale = 1.0f / 37.0f;

// Targets over the whole vocabulary, three of them the ignore index (one a chunk's first token).
std::vector<int32_t> make_targets() {
  std::vector<int32_t> targets(kTokens);
  Rng rng(7, "vocab-parallel targets");
  for (int32_t& t : targets) t = static_cast<int32_t>(rng.next_u64() % kVocab);
  targets[3] = targets[16] = targets[kTokens - 1] = kIgnoreIndex;
  return targets;
}

template <typename T>
std::vector<T> shard_rows(const std::vector<T>& whole, const VocabShard& shard, int64_t dim) {
  return {whole.begin() + shard.start * dim, whole.begin() + (shard.start + shard.rows) * dim};
}

struct LossInputs {
  std::vector<float> x = uniform(kTokens * kHidden, 1);
  // Logits of order ten (weights up to 2, 48 terms): softmaxes far from uniform.
  std::vector<float> weight = uniform(kVocab * kHidden, 2, -2.0f, 2.0f);
  std::vector<float> dweight0 = uniform(kVocab * kHidden, 3);  // accumulated into
  std::vector<int32_t> targets = make_targets();
  std::vector<uint16_t> weight16 = rounded(weight);
};

struct LossOutputs {
  double loss = 0.0;
  int64_t scored = 0;
  std::vector<float> dx, dweight, logits;
};

// The gathered loss: the chunked kernel over the whole vocabulary.
LossOutputs gathered_loss(const LossInputs& in, bool bf16) {
  LossOutputs out;
  out.dx.assign(kTokens * kHidden, 0.0f);
  out.dweight = in.dweight0;
  out.logits.assign(kTokens * kVocab, 0.0f);
  std::vector<uint16_t> x16(kTokens * kHidden);
  CrossEntropyArgs a;
  a.x = in.x.data(), a.weight = in.weight.data(), a.targets = in.targets.data();
  a.weight_bf16 = bf16 ? in.weight16.data() : nullptr, a.x_bf16 = x16.data();
  a.n_tokens = kTokens, a.hidden = kHidden, a.vocab = kVocab, a.chunk_tokens = kChunk;
  a.dx = out.dx.data(), a.dweight = out.dweight.data(), a.grad_scale = kGradScale;
  a.logits = out.logits.data();
  const CrossEntropyResult r = lm_head_cross_entropy(a);
  out.loss = r.loss_sum, out.scored = r.n_scored;
  return out;
}

// One rank's part: its loss, partial d x, its rows of d weight and its columns of the logits.
LossOutputs rank_loss(const LossInputs& in, const VocabShard& shard, bool bf16) {
  LossOutputs out;
  out.dx.assign(kTokens * kHidden, 0.0f);
  out.dweight = shard_rows(in.dweight0, shard, kHidden);
  out.logits.assign(kTokens * shard.rows, 0.0f);
  const std::vector<float> weight = shard_rows(in.weight, shard, kHidden);
  const std::vector<uint16_t> weight16 = shard_rows(in.weight16, shard, kHidden);
  std::vector<uint16_t> x16(kTokens * kHidden);
  CrossEntropyArgs a;
  a.x = in.x.data(), a.weight = weight.data(), a.targets = in.targets.data();
  a.weight_bf16 = bf16 ? weight16.data() : nullptr, a.x_bf16 = x16.data();
  a.n_tokens = kTokens, a.hidden = kHidden, a.vocab = shard.rows, a.chunk_tokens = kChunk;
  a.dx = out.dx.data(), a.dweight = out.dweight.data(), a.grad_scale = kGradScale;
  a.logits = out.logits.data();
  const CrossEntropyResult r = lm_head_cross_entropy_vocab_parallel(a, shard);
  out.loss = r.loss_sum, out.scored = r.n_scored;
  return out;
}

// The gathered loss's logits columns [shard.start, shard.start + shard.rows).
std::vector<float> logits_columns(const std::vector<float>& logits, const VocabShard& shard) {
  std::vector<float> out;
  for (int64_t n = 0; n < kTokens; ++n) {
    const auto row = logits.begin() + n * kVocab + shard.start;
    out.insert(out.end(), row, row + shard.rows);
  }
  return out;
}

// Every rank's loss equals the gathered one; the sum of the partial d x and the concatenated
// d weight rows equal its gradients. fp32 within fp32's rounding bound for sums of the longest
// dot product's length; the bf16 form's gradients within the verify-kernels bf16 bound (the
// group's fp32 sum of exps may round a d logit to the neighbouring bf16 value).
void expect_equal_to_gathered(const LossInputs& in, const std::vector<LossOutputs>& ranks,
                              const std::vector<VocabShard>& shards, bool bf16,
                              const std::string& what) {
  const LossOutputs whole = gathered_loss(in, bf16);
  ASSERT_EQ(whole.scored, kTokens - 3);
  const double fp32 = fp32_tolerance(std::max({kVocab, kHidden, kTokens}));
  std::vector<float> dx(kTokens * kHidden, 0.0f), dweight;
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(ranks[r].scored, whole.scored) << what << " rank " << r;
    EXPECT_NEAR(ranks[r].loss, whole.loss, fp32 * whole.loss) << what << " rank " << r;
    EXPECT_EQ(ranks[r].loss, ranks[0].loss) << what << ": every rank holds the same loss";
    for (size_t i = 0; i < dx.size(); ++i) dx[i] += ranks[r].dx[i];
    dweight.insert(dweight.end(), ranks[r].dweight.begin(), ranks[r].dweight.end());
    const std::vector<float> columns = logits_columns(whole.logits, shards[r]);
    expect_close(what + " rank " + std::to_string(r) + " logits", ranks[r].logits.data(),
                 columns.data(), static_cast<int64_t>(columns.size()), fp32);
  }
  const double gradients = bf16 ? kBf16Tolerance : fp32;
  expect_close(what + " dx summed", dx.data(), whole.dx.data(), kTokens * kHidden, gradients);
  expect_close(what + " dweight rows", dweight.data(), whole.dweight.data(), kVocab * kHidden,
               gradients);
}

void check_loss_in_threads(int degree, bool bf16) {
  const LossInputs in;
  std::vector<LossOutputs> ranks(degree);
  std::vector<VocabShard> shards(degree);
  run_vocab_ranks_in_threads(kVocab, degree, [&](const VocabShard& shard) {
    const auto rank = static_cast<size_t>(shard.start / shard.rows);
    shards[rank] = shard;
    ranks[rank] = rank_loss(in, shard, bf16);
  });
  expect_equal_to_gathered(in, ranks, shards, bf16,
                           std::to_string(degree) + (bf16 ? " ranks bf16" : " ranks fp32"));
}

TEST(VocabParallelLoss, TwoRanksEqualTheGatheredLoss) {
  check_loss_in_threads(2, false);
}
TEST(VocabParallelLoss, ThreeRanksEqualTheGatheredLoss) {
  check_loss_in_threads(3, false);
}
TEST(VocabParallelLoss, Bf16TwoRanksEqualTheGatheredLoss) {
  check_loss_in_threads(2, true);
}
TEST(VocabParallelLoss, Bf16ThreeRanksEqualTheGatheredLoss) {
  check_loss_in_threads(3, true);
}

TEST(VocabParallelLoss, ForwardOnlyGivesTheLoss) {
  const LossInputs in;
  std::vector<double> losses(2);
  run_vocab_ranks_in_threads(kVocab, 2, [&](const VocabShard& shard) {
    const std::vector<float> weight = shard_rows(in.weight, shard, kHidden);
    CrossEntropyArgs a;
    a.x = in.x.data(), a.weight = weight.data(), a.targets = in.targets.data();
    a.n_tokens = kTokens, a.hidden = kHidden, a.vocab = shard.rows, a.chunk_tokens = kChunk;
    losses[shard.start / shard.rows] = lm_head_cross_entropy_vocab_parallel(a, shard).loss_sum;
  });
  const double want = gathered_loss(in, false).loss;
  const double fp32 = fp32_tolerance(std::max({kVocab, kHidden, kTokens}));
  for (const double loss : losses) EXPECT_NEAR(loss, want, fp32 * want);
}

// Tied embeddings: the lm_head is the embedding, and both backwards accumulate into the same
// rows of the one gradient.
TEST(VocabParallelLoss, TiedEmbeddingRowsTakeBothGradients) {
  const LossInputs in;
  const std::vector<float> dout = uniform(kTokens * kHidden, 9);
  const std::vector<int32_t> ids = [&] {
    std::vector<int32_t> v(kTokens);
    for (int64_t n = 0; n < kTokens; ++n) v[n] = static_cast<int32_t>((n * 29 + 5) % kVocab);
    return v;
  }();
  LossOutputs whole = gathered_loss(in, false);
  embedding_backward(whole.dweight.data(), dout.data(), ids.data(), kTokens, kHidden);
  std::vector<std::vector<float>> rows(2);
  run_vocab_ranks_in_threads(kVocab, 2, [&](const VocabShard& shard) {
    LossOutputs part = rank_loss(in, shard, false);
    embedding_backward_vocab_parallel(part.dweight.data(), dout.data(), ids.data(), kTokens, shard,
                                      kHidden);
    rows[shard.start / shard.rows] = part.dweight;
  });
  std::vector<float> dweight = rows[0];
  dweight.insert(dweight.end(), rows[1].begin(), rows[1].end());
  expect_close("tied dweight rows", dweight.data(), whole.dweight.data(), kVocab * kHidden,
               fp32_tolerance(std::max({kVocab, kHidden, kTokens})));
}

// A rank's chunk of logits is 1 / degree of the gathered loss's: the same tokens per chunk
// (chosen from the whole vocabulary), its rows of the vocabulary.
TEST(VocabParallelLoss, WorkspaceHoldsOneDegreeOfTheLogitsChunk) {
  for (const int64_t chunk_tokens : {int64_t{0}, kChunk}) {
    for (const int degree : {2, 3}) {
      const int64_t vocab = 151936 / 4 * 3;  // divides over 2 and 3; several 64-token chunks
      const int64_t n = 3000, hidden = 64;
      const VocabShard shard = VocabShard::of(vocab, 1, degree);
      const int64_t chunk = lm_head_chunk_tokens(n, vocab, chunk_tokens);
      const int64_t whole_logits = chunk * vocab * static_cast<int64_t>(sizeof(float));
      const int64_t gathered = lm_head_workspace_bytes(n, hidden, vocab, chunk_tokens, false);
      const int64_t local =
          lm_head_vocab_parallel_workspace_bytes(n, hidden, shard, chunk_tokens, false);
      EXPECT_EQ(gathered - local, whole_logits - whole_logits / degree)
          << "degree " << degree << ", chunk_tokens " << chunk_tokens;
      // bf16: the rank's logits chunk in bf16 and an fp32 row per thread of its columns; the
      // gathered loss's padded chunk and rows of the whole vocabulary.
      const int64_t gathered16 = lm_head_workspace_bytes(n, hidden, vocab, chunk_tokens, true);
      const int64_t local16 =
          lm_head_vocab_parallel_workspace_bytes(n, hidden, shard, chunk_tokens, true);
      EXPECT_GE(gathered16 - local16, (whole_logits - whole_logits / degree) / 2)
          << "degree " << degree << ", chunk_tokens " << chunk_tokens;
    }
  }
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(VocabParallelLoss, RefusesAVocabularyTheDegreeDoesNotDivide) {
  const std::string message = error_of([] { VocabShard::of(97, 0, 2); });
  EXPECT_NE(
      message.find("vocabulary of 97 rows does not divide over a tensor-parallel degree of 2"),
      std::string::npos)
      << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "one line: " << message;
  EXPECT_NE(error_of([] { VocabShard::of(96, 3, 3); }).find("rank 3"), std::string::npos);
}

TEST(VocabParallelLoss, RefusesBadArguments) {
  const LossInputs in;
  VocabShard shard = VocabShard::of(kVocab, 0, 2);
  const std::vector<float> weight = shard_rows(in.weight, shard, kHidden);
  std::vector<int32_t> targets = in.targets;
  CrossEntropyArgs a;
  a.x = in.x.data(), a.weight = weight.data(), a.targets = targets.data();
  a.n_tokens = kTokens, a.hidden = kHidden, a.vocab = shard.rows;
  EXPECT_NE(error_of([&] {
              lm_head_cross_entropy_vocab_parallel(a, shard);
            }).find("no group reductions bound"),
            std::string::npos);
  shard.all_reduce_max = shard.all_reduce_sum = [](float*, int64_t) {};
  a.vocab = kVocab;
  EXPECT_NE(error_of([&] {
              lm_head_cross_entropy_vocab_parallel(a, shard);
            }).find("the lm_head's 96 local rows are not the shard's rows [0, 48) of 96"),
            std::string::npos);
  a.vocab = shard.rows;
  targets[4] = static_cast<int32_t>(kVocab);
  EXPECT_NE(error_of([&] {
              lm_head_cross_entropy_vocab_parallel(a, shard);
            }).find("target 96 at token 4 is outside [0, 96)"),
            std::string::npos);
}

// The threads' group itself: reductions combine every rank's values; a rank that fails before
// a reduction neither hangs the others nor loses its error.
TEST(VocabParallelThreads, ReduceOverRanksAndSurviveAFailingRank) {
  std::vector<std::vector<float>> got(3);
  run_vocab_ranks_in_threads(kVocab, 3, [&](const VocabShard& shard) {
    const auto rank = static_cast<float>(shard.start / shard.rows);
    std::vector<float> v = {rank, -rank, 2.0f * rank};
    shard.all_reduce_max(v.data(), 2);
    shard.all_reduce_sum(v.data() + 2, 1);
    got[static_cast<size_t>(rank)] = v;
  });
  for (const std::vector<float>& v : got) EXPECT_EQ(v, (std::vector<float>{2.0f, 0.0f, 6.0f}));
  const std::string message = error_of([] {
    run_vocab_ranks_in_threads(kVocab, 2, [](const VocabShard& shard) {
      if (shard.start > 0) fail("rank 1 failed");
      std::vector<float> v(4, 1.0f);
      shard.all_reduce_max(v.data(), 4);
      shard.all_reduce_sum(v.data(), 4);
    });
  });
  EXPECT_EQ(message, "rank 1 failed");
}

// The embedding: the group's sum of the lookups is the whole lookup exactly (one rank holds each
// row, the others add zeros), and the concatenated d weight rows are the whole scatter exactly
// (each row's tokens summed in the same order).
TEST(VocabParallelEmbedding, TwoAndThreeRanksEqualTheWholeEmbedding) {
  const int64_t n = 70, dim = 40;
  const std::vector<float> weight = uniform(kVocab * dim, 11), dout = uniform(n * dim, 12),
                           dweight0 = uniform(kVocab * dim, 13);
  std::vector<int32_t> ids(n);
  for (int64_t t = 0; t < n; ++t) ids[t] = static_cast<int32_t>((t * 37 + 11) % kVocab);
  ids[5] = ids[6] = ids[40];  // repeated ids
  std::vector<float> want(n * dim), want_dweight = dweight0;
  embedding_forward(want.data(), ids.data(), weight.data(), n, kVocab, dim);
  embedding_backward(want_dweight.data(), dout.data(), ids.data(), n, dim);
  for (const int degree : {2, 3}) {
    std::vector<float> out(n * dim, 0.0f), dweight;
    for (int rank = 0; rank < degree; ++rank) {
      const VocabShard shard = VocabShard::of(kVocab, rank, degree);
      const std::vector<float> local = shard_rows(weight, shard, dim);
      std::vector<float> part(n * dim, -1.0f);  // overwritten everywhere
      embedding_forward_vocab_parallel(part.data(), ids.data(), local.data(), n, shard, dim);
      for (size_t i = 0; i < out.size(); ++i) out[i] += part[i];
      std::vector<float> rows = shard_rows(dweight0, shard, dim);
      embedding_backward_vocab_parallel(rows.data(), dout.data(), ids.data(), n, shard, dim);
      dweight.insert(dweight.end(), rows.begin(), rows.end());
    }
    EXPECT_EQ(out, want) << degree << " ranks";
    EXPECT_EQ(dweight, want_dweight) << degree << " ranks";
  }
  const VocabShard shard = VocabShard::of(kVocab, 1, 2);
  ids[9] = static_cast<int32_t>(kVocab);
  std::vector<float> out(n * dim);
  EXPECT_NE(error_of([&] {
              embedding_forward_vocab_parallel(out.data(), ids.data(), weight.data(), n, shard,
                                               dim);
            }).find("token id 96 at position 9 is outside the vocabulary [0, 96)"),
            std::string::npos);
}

// The world's ranks as the tensor-parallel group (one rank without mpirun): the reductions on
// its communicator -- the max through doubles, which hold every float exactly.
VocabShard world_shard(int64_t total) {
  Communicator& comm = world();
  VocabShard shard = VocabShard::of(total, comm.rank(), comm.size());
  shard.all_reduce_sum = [&comm](float* data, int64_t count) { comm.all_reduce_sum(data, count); };
  shard.all_reduce_max = [&comm](float* data, int64_t count) {
    std::vector<double> wide(data, data + count);
    comm.all_reduce_max(wide.data(), count);
    std::copy(wide.begin(), wide.end(), data);
  };
  return shard;
}

// Each rank's d x part summed over the world; every rank's d weight rows gathered through a sum
// of zero-padded copies.
void check_loss_on_world(bool bf16) {
  Communicator& comm = world();
  const LossInputs in;
  const VocabShard shard = world_shard(kVocab);
  LossOutputs part = rank_loss(in, shard, bf16);
  std::vector<double> loss{part.loss};
  comm.all_reduce_sum(loss.data(), 1);
  EXPECT_EQ(loss[0], part.loss * comm.size()) << "every rank holds the same loss";
  const LossOutputs whole = gathered_loss(in, bf16);
  const double fp32 = fp32_tolerance(std::max({kVocab, kHidden, kTokens}));
  EXPECT_NEAR(part.loss, whole.loss, fp32 * whole.loss);
  EXPECT_EQ(part.scored, whole.scored);
  comm.all_reduce_sum(part.dx.data(), kTokens * kHidden);
  std::vector<float> dweight(kVocab * kHidden, 0.0f);
  std::copy(part.dweight.begin(), part.dweight.end(), dweight.begin() + shard.start * kHidden);
  comm.all_reduce_sum(dweight.data(), kVocab * kHidden);
  const std::string what = "rank " + std::to_string(comm.rank()) + " of " +
                           std::to_string(comm.size()) + (bf16 ? " bf16" : " fp32");
  const double gradients = bf16 ? kBf16Tolerance : fp32;
  expect_close(what + " dx summed", part.dx.data(), whole.dx.data(), kTokens * kHidden, gradients);
  expect_close(what + " dweight rows", dweight.data(), whole.dweight.data(), kVocab * kHidden,
               gradients);
  const std::vector<float> columns = logits_columns(whole.logits, shard);
  expect_close(what + " logits", part.logits.data(), columns.data(),
               static_cast<int64_t>(columns.size()), fp32);
}

TEST(VocabParallelWorld, LossEqualsTheGatheredLoss) {
  check_loss_on_world(false);
}
TEST(VocabParallelWorld, Bf16LossEqualsTheGatheredLoss) {
  check_loss_on_world(true);
}

TEST(VocabParallelWorld, EmbeddingSumsToTheWholeLookup) {
  Communicator& comm = world();
  const int64_t n = 33, dim = 24;
  const std::vector<float> weight = uniform(kVocab * dim, 21), dout = uniform(n * dim, 22);
  std::vector<int32_t> ids(n);
  for (int64_t t = 0; t < n; ++t) ids[t] = static_cast<int32_t>((t * 53 + 7) % kVocab);
  std::vector<float> want(n * dim), want_dweight(kVocab * dim, 0.0f);
  embedding_forward(want.data(), ids.data(), weight.data(), n, kVocab, dim);
  embedding_backward(want_dweight.data(), dout.data(), ids.data(), n, dim);
  const VocabShard shard = world_shard(kVocab);
  const std::vector<float> local = shard_rows(weight, shard, dim);
  std::vector<float> out(n * dim);
  embedding_forward_vocab_parallel(out.data(), ids.data(), local.data(), n, shard, dim);
  comm.all_reduce_sum(out.data(), n * dim);
  EXPECT_EQ(out, want);
  std::vector<float> dweight(kVocab * dim, 0.0f);
  embedding_backward_vocab_parallel(dweight.data() + shard.start * dim, dout.data(), ids.data(), n,
                                    shard, dim);
  comm.all_reduce_sum(dweight.data(), kVocab * dim);
  EXPECT_EQ(dweight, want_dweight);
}

TEST(VocabParallelWorld, RefusesAVocabularyTheWorldDoesNotDivide) {
  if (world().size() == 1) GTEST_SKIP() << "one rank divides every vocabulary";
  const std::string message = error_of([] { world_shard(kVocab * world().size() + 1); });
  EXPECT_NE(message.find("does not divide over a tensor-parallel degree of " +
                         std::to_string(world().size())),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace titan
