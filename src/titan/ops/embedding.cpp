#include "titan/ops/embedding.h"

#include <algorithm>
#include <cstring>
#include <limits>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/ops/host_parallel.h"

namespace titan {

namespace {

void check_ids(const int32_t* ids, int64_t n_tokens, int64_t vocab) {
  for (int64_t n = 0; n < n_tokens; ++n) {
    TITAN_CHECK(ids[n] >= 0 && ids[n] < vocab, "token id ", ids[n], " at position ", n,
                " is outside the vocabulary [0, ", vocab, ")");
  }
}

// dweight (rows, d) += dout (N, d) scattered by ids[n] - start, for the ids in [start, start +
// rows). Threads own disjoint column ranges, so repeated ids never race and the summation order
// over tokens is fixed (deterministic).
void scatter_rows(float* dweight, const float* dout, const int32_t* ids, int64_t n_tokens,
                  int64_t start, int64_t rows, int64_t dim) {
  constexpr int64_t kColumns = 64;
  const int64_t n_blocks = (dim + kColumns - 1) / kColumns;
#pragma omp parallel for schedule(static)
  for (int64_t block = 0; block < n_blocks; ++block) {
    const int64_t c0 = block * kColumns, c1 = std::min(dim, c0 + kColumns);
    for (int64_t n = 0; n < n_tokens; ++n) {
      const int64_t row = ids[n] - start;
      if (row < 0 || row >= rows) continue;
      float* out = dweight + row * dim;
      const float* g = dout + n * dim;
      for (int64_t c = c0; c < c1; ++c) out[c] += g[c];
    }
  }
}

}  // namespace

void embedding_forward(float* out, const int32_t* ids, const float* weight, int64_t n_tokens,
                       int64_t vocab, int64_t dim) {
  check_ids(ids, n_tokens, vocab);
#pragma omp parallel for schedule(static) if (n_tokens * dim >= kMinParallelElements)
  for (int64_t n = 0; n < n_tokens; ++n) {
    std::memcpy(out + n * dim, weight + static_cast<int64_t>(ids[n]) * dim, dim * sizeof(float));
  }
}

void embedding_forward_bf16(float* out, const int32_t* ids, const uint16_t* weight,
                            int64_t n_tokens, int64_t vocab, int64_t dim) {
  check_ids(ids, n_tokens, vocab);
  const VecKernels& v = backend().vec();
#pragma omp parallel for schedule(static) if (n_tokens * dim >= kMinParallelElements)
  for (int64_t n = 0; n < n_tokens; ++n) {
    v.widen_bf16(out + n * dim, weight + static_cast<int64_t>(ids[n]) * dim, dim);
  }
}

void embedding_backward(float* dweight, const float* dout, const int32_t* ids, int64_t n_tokens,
                        int64_t dim) {
  scatter_rows(dweight, dout, ids, n_tokens, 0, std::numeric_limits<int64_t>::max(), dim);
}

void embedding_forward_vocab_parallel(float* out, const int32_t* ids, const float* weight,
                                      int64_t n_tokens, const VocabShard& shard, int64_t dim) {
  check_ids(ids, n_tokens, shard.total);
#pragma omp parallel for schedule(static) if (n_tokens * dim >= kMinParallelElements)
  for (int64_t n = 0; n < n_tokens; ++n) {
    const int64_t row = ids[n] - shard.start;
    if (row >= 0 && row < shard.rows) {
      std::memcpy(out + n * dim, weight + row * dim, dim * sizeof(float));
    } else {
      std::memset(out + n * dim, 0, dim * sizeof(float));
    }
  }
}

void embedding_backward_vocab_parallel(float* dweight, const float* dout, const int32_t* ids,
                                       int64_t n_tokens, const VocabShard& shard, int64_t dim) {
  scatter_rows(dweight, dout, ids, n_tokens, shard.start, shard.rows, dim);
}

}  // namespace titan
