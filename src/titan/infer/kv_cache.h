// The static KV cache of one sequence: keys (after k_norm and RoPE) and values of every layer,
// allocated once for max_len positions (prompt + new tokens) so each decode step writes one row
// and attends over a buffer that never moves or grows (qwen3-spec.md §8.2).
#pragma once

#include <cstdint>

#include "titan/core/allocator.h"
#include "titan/models/model_args.h"

namespace titan {

class KvCache {
 public:
  // max_len in [1, max_position_embeddings], else titan::Error.
  KvCache(const ModelArgs& args, int64_t max_len);

  // Layer `layer`'s keys / values, each (max_len, KV, hd); rows [0, length()) are filled.
  float* keys(int64_t layer) const { return base(layer); }
  float* values(int64_t layer) const { return base(layer) + layer_stride_; }

  int64_t max_len() const { return max_len_; }
  int64_t length() const { return length_; }
  // Marks n more rows as filled (the caller has written them); titan::Error past max_len.
  void advance(int64_t n);
  // Keeps rows [0, n) and forgets the rest, which the next calls overwrite (n = 0: all of them);
  // titan::Error unless 0 <= n <= length().
  void truncate(int64_t n);
  size_t bytes() const { return storage_.bytes(); }

 private:
  float* base(int64_t layer) const { return storage_.as<float>() + 2 * layer * layer_stride_; }

  int64_t n_layers_ = 0, max_len_ = 0, length_ = 0;
  int64_t layer_stride_ = 0;  // max_len * KV * hd floats: one of keys or values of one layer
  Buffer storage_;            // (layers, 2, max_len, KV, hd)
};

}  // namespace titan
