// What every family's config.json reader and writer (models/<family>/hf_config.cpp) shares:
// typed access to the JSON fields with errors naming file and field, the keys all families have
// (dims, norms, RoPE, token ids) and the features none of them lets titan compute differently.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/models/model_args.h"

namespace titan::hf {

using json = nlohmann::json;

// Typed access to one JSON object's fields; every error names the file and the field.
class Fields {
 public:
  Fields(const json& object, std::string where, std::string prefix = "");

  // nullptr when absent or null (HF treats both as "not set").
  const json* get(const char* key) const;
  // The key is there, even as null (for token ids, where null means "none" and absent means the
  // class default).
  bool present(const char* key) const { return j_.contains(key); }
  std::string name(const char* key) const { return prefix_ + key; }
  const std::string& where() const { return where_; }

  int64_t integer(const json& v, const std::string& field) const;
  // A dimension or count: required, an integer in [1, 2^31 - 1].
  int64_t size(const char* key) const;
  int64_t size(const char* key, int64_t fallback) const;
  double number(const char* key, double fallback) const;
  bool boolean(const char* key, bool fallback) const;
  std::string string(const char* key, const std::string& fallback) const;
  // A token id: absent/null -> -1, else an integer in [0, vocab_size).
  int64_t token(const char* key, int64_t vocab_size) const;
  // An id or a list of ids (eos_token_id).
  std::vector<int64_t> tokens(const char* key, int64_t vocab_size) const;

 private:
  int64_t checked_size(const json& v, const std::string& field) const;
  int64_t checked_token(const json& v, const std::string& field, int64_t vocab_size) const;

  const json& j_;
  std::string where_;
  std::string prefix_;
};

// The Transformers config class's defaults for the common keys where families differ, used when
// config.json leaves the key out.
struct ClassDefaults {
  int64_t head_dim = 0;                    // 0: hidden_size / num_attention_heads
  bool kv_heads_default_to_heads = false;  // else num_key_value_heads is required
  int64_t max_position_embeddings = 32768;
  int64_t bos_token_id = -1;  // -1: none
  std::vector<int64_t> eos_token_ids;
};

// The keys every family has -- dims but intermediate_size (MoE reads it its own way), RoPE,
// norms, tied embeddings, token ids -- and the refusals that hold for all: hidden_act other than
// silu, attention dropout. Feature flags are left for the family to set.
ModelArgs read_common(const Fields& f, const ClassDefaults& defaults);
// Qwen's sliding-window attention: use_sliding_window = true or a layer_types entry other than
// full_attention is refused.
void refuse_sliding_window(const Fields& f, const ModelArgs& a);

// The common keys as Transformers writes them: architectures, model_type, the weights' dtype as
// torch_dtype (4.x) and dtype (5.x), dims, norms, ids, and RoPE both ways (rope_theta +
// rope_scaling, and rope_parameters) so either major version reads it.
json common_config_json(const ModelArgs& a, const char* model_type, DType weights_dtype);
// A token id as config.json holds it (-1: null); a list of ids as an id, a list, or null if empty.
json id_json(int64_t id);
json ids_json(const std::vector<int64_t>& ids);
// Qwen's sliding-window keys, switched off; `layer_types` only where the class has it.
void write_no_sliding_window(const ModelArgs& a, json& c, bool layer_types);

}  // namespace titan::hf
