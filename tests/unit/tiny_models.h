// The tiny Qwen3 models of the model-folder tests (state-dict adapter, HF export and load, the
// `titan info` and `titan convert` commands, the Transformers round trips): every kind of tensor
// a real checkpoint has, small enough to write, load and compare in milliseconds.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "titan/models/model_args.h"

namespace titan::test {

// Dense: 2 layers, 4 query and 2 key/value heads of 16, hidden 32, MLP 48, vocab 97.
inline ModelArgs tiny_dense(bool tied) {
  ModelArgs a;
  a.vocab_size = 97;
  a.hidden_size = 32;
  a.intermediate_size = 48;
  a.num_hidden_layers = 2;
  a.num_attention_heads = 4;
  a.num_key_value_heads = 2;
  a.head_dim = 16;
  a.max_position_embeddings = 128;
  a.tie_word_embeddings = tied;
  a.bos_token_id = 1;
  a.eos_token_ids = {2};
  return a;
}

// `dense` made a Qwen3-MoE: `experts` experts of width `width`, `per_token` of them per token,
// every layer sparse except `dense_layers` (mlp_only_layers).
inline ModelArgs with_moe(ModelArgs dense, int64_t experts, int64_t per_token, int64_t width,
                          std::vector<int64_t> dense_layers) {
  dense.architecture = "Qwen3MoeForCausalLM";
  dense.num_experts = experts;
  dense.num_experts_per_tok = per_token;
  dense.moe_intermediate_size = width;
  dense.mlp_only_layers = std::move(dense_layers);
  return dense;
}

// tiny_dense(false) with layer 0 sparse (4 experts, 2 per token, width 16) and layer 1 dense.
inline ModelArgs tiny_moe() {
  return with_moe(tiny_dense(false), 4, 2, 16, {1});
}

}  // namespace titan::test
