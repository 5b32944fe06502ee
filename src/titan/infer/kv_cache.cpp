#include "titan/infer/kv_cache.h"

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/io/json_util.h"

namespace titan {

KvCache::KvCache(const ModelArgs& args, int64_t max_len, DType dtype)
    : dtype_(dtype), n_layers_(args.num_hidden_layers), max_len_(max_len) {
  TITAN_CHECK(max_len >= 1 && max_len <= args.max_position_embeddings, "KV cache length ", max_len,
              " must be in [1, max_position_embeddings = ", args.max_position_embeddings, "]");
  TITAN_CHECK(dtype == DType::f32 || dtype == DType::bf16, "KV cache in ", dtype_name(dtype),
              ": only F32 and BF16 are supported");
  layer_stride_ = max_len * args.num_key_value_heads * args.head_dim;
  storage_ = Buffer(backend().memory(),
                    static_cast<size_t>(2 * n_layers_ * layer_stride_) * dtype_size(dtype),
                    MemCategory::activations);
}

KvCacheView KvCache::layer(int64_t layer) const {
  const size_t element = dtype_size(dtype_);
  char* keys = storage_.as<char>() + static_cast<size_t>(2 * layer * layer_stride_) * element;
  return {dtype_, keys, keys + static_cast<size_t>(layer_stride_) * element};
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

DType kv_cache_dtype(const std::string& requested, DType weight_dtype) {
  if (requested == "auto") return weight_dtype;
  if (requested == "bfloat16" || requested == "bf16") return DType::bf16;
  if (requested == "float32" || requested == "fp32") return DType::f32;
  fail("KV cache dtype ", json_quote(requested),
       " is not one of auto, bfloat16, float32 (or bf16, fp32)");
}

}  // namespace titan
