#include "titan/models/param_count.h"

namespace titan {

ParamCounts count_parameters(const ModelArgs& a) {
  const int64_t h = a.hidden_size;
  ParamCounts c;
  c.embedding = a.vocab_size * h * (a.tie_word_embeddings ? 1 : 2);
  // q, k, v, o projections plus the per-head q_norm and k_norm weights.
  const int64_t attention =
      h * a.head_dim * (2 * a.num_attention_heads + 2 * a.num_key_value_heads) + 2 * a.head_dim;
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
      c.total += 3 * h * a.intermediate_size;
      c.active += 3 * h * a.intermediate_size;
    }
  }
  return c;
}

}  // namespace titan
