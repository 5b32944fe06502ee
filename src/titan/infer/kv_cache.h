// The static KV cache of one sequence: keys (after k_norm and RoPE) and values of every layer,
// allocated once for max_len positions (prompt + new tokens) so each decode step writes one row
// and attends over a buffer that never moves or grows (qwen3-spec.md §8.2). fp32, or bf16 (each
// key and value rounded to nearest even once, when written): half the bytes to hold and to read
// per decode step, as torch keeps a bf16 model's cache.
#pragma once

#include <cstdint>
#include <string>

#include "titan/core/allocator.h"
#include "titan/core/dtype.h"
#include "titan/models/model_args.h"
#include "titan/nn/layers.h"

namespace titan {

class KvCache {
 public:
  // max_len in [1, max_position_embeddings] and dtype f32 or bf16, else titan::Error.
  KvCache(const ModelArgs& args, int64_t max_len, DType dtype = DType::f32);

  // Layer `layer`'s keys and values, each (max_len, KV, hd); rows [0, length()) are filled.
  KvCacheView layer(int64_t layer) const;

  DType dtype() const { return dtype_; }
  int64_t max_len() const { return max_len_; }
  int64_t length() const { return length_; }
  // Marks n more rows as filled (the caller has written them); titan::Error past max_len.
  void advance(int64_t n);
  // Keeps rows [0, n) and forgets the rest, which the next calls overwrite (n = 0: all of them);
  // titan::Error unless 0 <= n <= length().
  void truncate(int64_t n);
  size_t bytes() const { return storage_.bytes(); }

 private:
  DType dtype_ = DType::f32;
  int64_t n_layers_ = 0, max_len_ = 0, length_ = 0;
  int64_t layer_stride_ = 0;  // max_len * KV * hd elements: one of keys or values of one layer
  Buffer storage_;            // (layers, 2, max_len, KV, hd)
};

// The cache dtype `titan generate --kv-cache-dtype` names: "auto" (or empty) is the weights' dtype
// (a bf16 model's cache in bf16, as torch keeps it); "bfloat16" / "bf16" and "float32" / "fp32"
// force one. Anything else is a titan::Error.
DType kv_cache_dtype(const std::string& requested, DType weight_dtype);

}  // namespace titan
