// A tensor-parallel rank's rows of the vocabulary: the embedding and the lm_head cut along dim 0
// (the parallelize plan's `vocab` style, models/parallelize.h), as torchtitan's RowwiseParallel
// embedding and loss_parallel cut them. The vocabulary-parallel ops (ops/embedding.h,
// ops/cross_entropy.h) take one.
#pragma once

#include <cstdint>
#include <functional>

namespace titan {

struct VocabShard {
  // This rank's rows [start, start + rows) of the vocabulary's `total`.
  int64_t start = 0, rows = 0, total = 0;
  // The group's reductions over `count` floats in place: the elementwise maximum and sum over the
  // ranks, the same bits on every rank. Every rank calls them in the same order with the same
  // count. ops/ reaches no communicator: the caller binds them to its tensor-parallel group (as
  // nn/layers.h LayerCollectives binds sum_partials). Only the loss calls them.
  std::function<void(float*data, int64_t count)> all_reduce_max, all_reduce_sum;

  // Rank `rank`'s rows of a vocabulary of `total` cut evenly over `degree` ranks, without
  // reductions: [rank total / degree, (rank + 1) total / degree). titan::Error unless `degree`
  // divides `total` and 0 <= rank < degree.
  static VocabShard of(int64_t total, int rank, int degree);
};

}  // namespace titan
