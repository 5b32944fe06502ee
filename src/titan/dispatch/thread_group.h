// A tensor-parallel group's ranks as threads of one process, for checking the vocabulary-parallel
// forms (ops/vocab_shard.h) without MPI: `titan verify-kernels`
// (dispatch/verify_vocab_parallel.cpp) and the unit tests run each rank's part on its own thread,
// the shards' reductions meeting behind a barrier.
#pragma once

#include <algorithm>
#include <barrier>
#include <exception>
#include <functional>
#include <thread>
#include <vector>

#include "titan/ops/vocab_shard.h"

namespace titan {

// Runs body(shard) for every rank of a vocabulary of `total` rows cut over `degree` ranks, each on
// its own thread, shard = VocabShard::of(total, rank, degree) with its reductions bound to the
// other threads': every rank's values are combined in rank order, so each rank gets the same
// bits. Returns when every rank has; the first rank's error (in rank order) is then rethrown. A
// rank that fails leaves the barrier, so the others finish (their results then meaningless).
inline void run_vocab_ranks_in_threads(int64_t total, int degree,
                                       const std::function<void(const VocabShard&)>& body) {
  std::vector<VocabShard> shards;
  for (int rank = 0; rank < degree; ++rank) shards.push_back(VocabShard::of(total, rank, degree));
  std::vector<std::vector<float>> posted(static_cast<size_t>(degree));
  std::barrier<> meet(degree);
  const auto reduce = [&](int rank, float* data, int64_t count, bool max) {
    posted[rank].assign(data, data + count);
    meet.arrive_and_wait();  // every rank's values posted
    std::vector<float> combined;
    for (const std::vector<float>& values : posted) {
      if (values.size() != static_cast<size_t>(count)) continue;  // a rank that left
      if (combined.empty()) {
        combined = values;
        continue;
      }
      for (int64_t i = 0; i < count; ++i) {
        combined[i] = max ? std::max(combined[i], values[i]) : combined[i] + values[i];
      }
    }
    meet.arrive_and_wait();  // every rank has read the others' values
    std::copy(combined.begin(), combined.end(), data);
  };
  for (int rank = 0; rank < degree; ++rank) {
    shards[rank].all_reduce_max = [&, rank](float* data, int64_t count) {
      reduce(rank, data, count, true);
    };
    shards[rank].all_reduce_sum = [&, rank](float* data, int64_t count) {
      reduce(rank, data, count, false);
    };
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(degree));
  std::vector<std::thread> threads;
  for (int rank = 0; rank < degree; ++rank) {
    threads.emplace_back([&, rank] {
      try {
        body(shards[rank]);
      } catch (...) {
        errors[rank] = std::current_exception();
        meet.arrive_and_drop();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const std::exception_ptr& e : errors) {
    if (e) std::rethrow_exception(e);
  }
}

}  // namespace titan
