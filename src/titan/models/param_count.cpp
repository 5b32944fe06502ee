#include "titan/models/param_count.h"

namespace titan {

ParamCounts count_parameters(const ModelArgs& a) {
  const int64_t h = a.hidden_size;
  ParamCounts c;
  c.embedding = a.vocab_size * h * (a.tie_word_embeddings ? 1 : 2);
  // q, k, v, o projections, their biases, and the per-head q_norm and k_norm weights.
  const int64_t qkv_width = a.head_dim * (a.num_attention_heads + 2 * a.num_key_value_heads);
  const int64_t attention =
      h * a.head_dim * (2 * a.num_attention_heads + 2 * a.num_key_value_heads) +
      (a.attention_bias ? qkv_width : 0) + (a.o_proj_bias ? h : 0) +
      (a.qk_norm ? 2 * a.head_dim : 0);
  const int64_t dense_mlp =
      3 * h * a.intermediate_size + (a.mlp_bias ? 2 * a.intermediate_size + h : 0);
  const int64_t norms = 2 * h;
  c.total = c.active = c.embedding + h;  // + the final norm
  for (int64_t layer = 0; layer < a.num_hidden_layers; ++layer) {
    c.total += attention + norms;
    c.active += attention + norms;
    if (a.layer_is_sparse(layer)) {
      const int64_t expert = 3 * h * a.moe_intermediate_size;
      const int64_t router = a.num_experts * h;
      c.total += a.num_experts * expert + router;
      c.active += a.num_experts_per_tok * expert + router;
    } else {
      c.total += dense_mlp;
      c.active += dense_mlp;
    }
  }
  return c;
}

}  // namespace titan
