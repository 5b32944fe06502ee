#include "titan/ops/vocab_shard.h"

#include "titan/core/error.h"

namespace titan {

VocabShard VocabShard::of(int64_t total, int rank, int degree) {
  TITAN_CHECK(degree >= 1 && rank >= 0 && rank < degree, "vocabulary shard: rank ", rank,
              " is outside a tensor-parallel group of ", degree);
  TITAN_CHECK(total > 0 && total % degree == 0, "vocabulary-parallel: a vocabulary of ", total,
              " rows does not divide over a tensor-parallel degree of ", degree,
              " (the embedding and the lm_head are cut along the vocabulary)");
  VocabShard shard;
  shard.rows = total / degree;
  shard.start = shard.rows * rank;
  shard.total = total;
  return shard;
}

}  // namespace titan
