#include "titan/models/model_args.h"

#include <algorithm>

#include "titan/core/error.h"
#include "titan/models/registry.h"

namespace titan {

bool ModelArgs::layer_is_sparse(int64_t layer) const {
  const bool dense_listed =
      std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end();
  return !dense_listed && num_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
}

void validate_model_args(const ModelArgs& a, const std::string& where) {
  const auto positive = [&](int64_t value, const char* field) {
    TITAN_CHECK(value > 0, where, ": ", field, " must be positive, got ", value);
  };
  positive(a.vocab_size, "vocab_size");
  positive(a.hidden_size, "hidden_size");
  positive(a.num_hidden_layers, "num_hidden_layers");
  positive(a.num_attention_heads, "num_attention_heads");
  positive(a.num_key_value_heads, "num_key_value_heads");
  positive(a.head_dim, "head_dim");
  positive(a.max_position_embeddings, "max_position_embeddings");
  TITAN_CHECK(a.num_attention_heads % a.num_key_value_heads == 0, where, ": num_attention_heads (",
              a.num_attention_heads, ") must be a multiple of num_key_value_heads (",
              a.num_key_value_heads, ")");
  TITAN_CHECK(a.head_dim % 2 == 0, where, ": head_dim must be even for RoPE, got ", a.head_dim);
  TITAN_CHECK(a.rope_theta > 0, where, ": rope_theta must be positive, got ", a.rope_theta);
  TITAN_CHECK(a.rms_norm_eps > 0 && a.rms_norm_eps < 1, where,
              ": rms_norm_eps must be in (0, 1), got ", a.rms_norm_eps);
  TITAN_CHECK(a.initializer_range >= 0, where, ": initializer_range must not be negative");
  const RopeScaling& rope = a.rope_scaling;
  TITAN_CHECK(rope.type == "default" || rope.type == "yarn" || rope.type == "llama3", where,
              ": rope_scaling type '", rope.type, "' is not supported (default, yarn or llama3)");
  if (rope.type != "default") {
    TITAN_CHECK(rope.factor >= 1.0, where, ": rope_scaling.factor must be >= 1, got ", rope.factor);
    positive(rope.original_max_position_embeddings,
             "rope_scaling.original_max_position_embeddings");
  }
  if (rope.type == "llama3") {
    TITAN_CHECK(rope.low_freq_factor > 0, where,
                ": rope_scaling.low_freq_factor must be positive, got ", rope.low_freq_factor);
    TITAN_CHECK(rope.high_freq_factor > rope.low_freq_factor, where,
                ": rope_scaling.high_freq_factor (", rope.high_freq_factor,
                ") must exceed low_freq_factor (", rope.low_freq_factor, ")");
  }
  TITAN_CHECK(a.attn_backend == "blockwise" || a.attn_backend == "reference", where,
              ": attn_backend '", a.attn_backend, "' is unknown (blockwise or reference)");
  const ModelFamily& family = model_family(a.architecture, where);
  TITAN_CHECK(
      a.is_moe() == family.moe, where, ": ", a.architecture,
      family.moe ? " needs experts (num_experts > 0)" : " has no experts (num_experts = 0)");
  family.validate(a, where);
  if (a.is_moe()) {
    positive(a.num_experts_per_tok, "num_experts_per_tok");
    positive(a.moe_intermediate_size, "moe_intermediate_size");
    positive(a.decoder_sparse_step, "decoder_sparse_step");
    TITAN_CHECK(a.num_experts_per_tok <= a.num_experts, where, ": num_experts_per_tok (",
                a.num_experts_per_tok, ") exceeds num_experts (", a.num_experts, ")");
  }
  for (int64_t layer = 0; layer < a.num_hidden_layers; ++layer) {
    if (!a.layer_is_sparse(layer)) {
      TITAN_CHECK(a.intermediate_size > 0, where, ": intermediate_size must be positive, got ",
                  a.intermediate_size, " (layer ", layer, " has a dense MLP)");
      break;
    }
  }
  for (int64_t layer : a.mlp_only_layers) {
    TITAN_CHECK(layer >= 0 && layer < a.num_hidden_layers, where, ": mlp_only_layers entry ", layer,
                " is not a layer index");
  }
}

}  // namespace titan
