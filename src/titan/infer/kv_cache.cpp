#include "titan/infer/kv_cache.h"

#include "titan/core/error.h"

namespace titan {

KvCache::KvCache(const ModelArgs& args, int64_t max_len)
    : n_layers_(args.num_hidden_layers), max_len_(max_len) {
  TITAN_CHECK(max_len >= 1 && max_len <= args.max_position_embeddings, "KV cache length ", max_len,
              " must be in [1, max_position_embeddings = ", args.max_position_embeddings, "]");
  layer_stride_ = max_len * args.num_key_value_heads * args.head_dim;
  storage_ = Buffer(static_cast<size_t>(2 * n_layers_ * layer_stride_) * sizeof(float),
                    MemCategory::activations);
}

void KvCache::truncate(int64_t n) {
  TITAN_CHECK(n >= 0 && n <= length_, "KV cache truncated to ", n, " rows; it holds ", length_);
  length_ = n;
}

void KvCache::advance(int64_t n) {
  TITAN_CHECK(n >= 0 && length_ + n <= max_len_, "KV cache overflow: ", length_, " + ", n,
              " tokens exceed its ", max_len_, " positions");
  length_ += n;
}

}  // namespace titan
