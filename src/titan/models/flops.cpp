#include "titan/models/flops.h"

namespace titan {

double training_flops_per_token(const ModelArgs& a, int64_t seq_len) {
  const double h = static_cast<double>(a.hidden_size), hd = static_cast<double>(a.head_dim);
  double n_mm = 0.0;
  for (int64_t layer = 0; layer < a.num_hidden_layers; ++layer) {
    n_mm += h * hd * (2.0 * a.num_attention_heads + 2.0 * a.num_key_value_heads);
    if (a.layer_is_sparse(layer)) {
      n_mm += h * a.num_experts + 3.0 * h * a.moe_intermediate_size * a.num_experts_per_tok;
    } else {
      n_mm += 3.0 * h * a.intermediate_size;
    }
  }
  n_mm += static_cast<double>(a.vocab_size) * h;
  return 6.0 * n_mm + 12.0 * a.num_hidden_layers * a.num_attention_heads * hd * seq_len;
}

}  // namespace titan
