#include "titan/models/hf_config_common.h"

#include <limits>

#include "titan/core/error.h"
#include "titan/io/json_util.h"
#include "titan/models/hf_config.h"

namespace titan::hf {
namespace {

// Dims beyond int32 are not a real model, and refusing them keeps every product of two dims
// (parameter counts, buffer sizes) far from int64 overflow.
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
// HF's default_theta when a config names no rope_theta anywhere.
constexpr double kDefaultTheta = 10000.0;

void read_yarn(const Fields& r, RopeScaling& s) {
  // HF reads these with `or`, so 0 means the default too.
  const double beta_fast = r.number("beta_fast", 32.0);
  const double beta_slow = r.number("beta_slow", 1.0);
  s.beta_fast = beta_fast == 0 ? 32.0 : beta_fast;
  s.beta_slow = beta_slow == 0 ? 1.0 : beta_slow;
  s.attention_factor = r.number("attention_factor", 0.0);
  for (const char* key : {"mscale", "mscale_all_dim"}) {
    TITAN_CHECK(r.get(key) == nullptr, r.where(), ": ", r.name(key),
                " is not supported (DeepSeek's yarn variant)");
  }
  TITAN_CHECK(r.boolean("truncate", true), r.where(), ": ", r.name("truncate"),
              " = false is not supported");
}

// Transformers indexes these directly: a config without them does not load.
void read_llama3(const Fields& r, RopeScaling& s) {
  for (const char* key : {"low_freq_factor", "high_freq_factor"}) {
    TITAN_CHECK(r.get(key) != nullptr, r.where(), ": ", r.name(key),
                " is missing (llama3 needs it)");
  }
  s.low_freq_factor = r.number("low_freq_factor", 1.0);
  s.high_freq_factor = r.number("high_freq_factor", 4.0);
}

// RoPE the way Transformers 5 resolves it: a non-empty rope_scaling wins over rope_parameters
// (which may be nested under a layer type); rope_theta inside wins over the top-level one.
void read_rope(const Fields& f, ModelArgs& a) {
  const double top_theta = f.number("rope_theta", kDefaultTheta);
  const json* rope = f.get("rope_scaling");
  std::string field = "rope_scaling";
  if (rope == nullptr || (rope->is_object() && rope->empty())) {
    rope = f.get("rope_parameters");
    field = "rope_parameters";
  }
  a.rope_scaling = RopeScaling{};
  if (rope == nullptr) {
    a.rope_theta = top_theta;
    return;
  }
  TITAN_CHECK(rope->is_object(), f.where(), ": ", field, " must be an object or null, got ",
              json_excerpt(*rope));
  if (rope->contains("full_attention")) {
    TITAN_CHECK(rope->size() == 1, f.where(), ": ", field,
                " has per-layer-type entries other than full_attention, which titan does not use");
    rope = &(*rope)["full_attention"];
    field += ".full_attention";
    TITAN_CHECK(rope->is_object(), f.where(), ": ", field, " must be an object");
  }
  const Fields r(*rope, f.where(), field + ".");
  const std::string type = r.string("rope_type", r.string("type", "default"));
  a.rope_theta = r.number("rope_theta", top_theta);
  TITAN_CHECK(r.number("partial_rotary_factor", 1.0) == 1.0, f.where(), ": ",
              r.name("partial_rotary_factor"), " other than 1 is not supported");
  if (type == "default") return;
  TITAN_CHECK(type == "yarn" || type == "llama3", f.where(), ": ", r.name("rope_type"), " ",
              json_quote(type), " is not supported (default, yarn or llama3)");
  RopeScaling& s = a.rope_scaling;
  s.type = type;
  TITAN_CHECK(r.get("factor") != nullptr, f.where(), ": ", r.name("factor"), " is missing (", type,
              " needs it)");
  s.factor = r.number("factor", 1.0);
  // Transformers' standardize_rope_params: the model's context when the key is absent.
  s.original_max_position_embeddings =
      r.size("original_max_position_embeddings", a.max_position_embeddings);
  if (type == "yarn") {
    read_yarn(r, s);
  } else {
    read_llama3(r, s);
  }
}

json rope_scaling_json(const RopeScaling& s) {
  if (s.type == "default") return nullptr;
  json j = {{"rope_type", s.type},
            {"factor", s.factor},
            {"original_max_position_embeddings", s.original_max_position_embeddings}};
  if (s.type == "yarn") {
    j["beta_fast"] = s.beta_fast;
    j["beta_slow"] = s.beta_slow;
    if (s.attention_factor > 0) j["attention_factor"] = s.attention_factor;
  } else {
    j["low_freq_factor"] = s.low_freq_factor;
    j["high_freq_factor"] = s.high_freq_factor;
  }
  return j;
}

}  // namespace

Fields::Fields(const json& object, std::string where, std::string prefix)
    : j_(object), where_(std::move(where)), prefix_(std::move(prefix)) {}

const json* Fields::get(const char* key) const {
  const auto it = j_.find(key);
  return it == j_.end() || it->is_null() ? nullptr : &*it;
}

int64_t Fields::integer(const json& v, const std::string& field) const {
  TITAN_CHECK(v.is_number_integer(), where_, ": ", field, " must be an integer, got ",
              json_excerpt(v));
  TITAN_CHECK(!v.is_number_unsigned() ||
                  v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
              where_, ": ", field, " is out of range: ", json_excerpt(v));
  return v.get<int64_t>();
}

int64_t Fields::size(const char* key) const {
  const json* v = get(key);
  TITAN_CHECK(v != nullptr, where_, ": ", name(key), " is missing");
  return checked_size(*v, name(key));
}

int64_t Fields::size(const char* key, int64_t fallback) const {
  const json* v = get(key);
  return v == nullptr ? fallback : checked_size(*v, name(key));
}

double Fields::number(const char* key, double fallback) const {
  const json* v = get(key);
  if (v == nullptr) return fallback;
  TITAN_CHECK(v->is_number(), where_, ": ", name(key), " must be a number, got ", json_excerpt(*v));
  return v->get<double>();
}

bool Fields::boolean(const char* key, bool fallback) const {
  const json* v = get(key);
  if (v == nullptr) return fallback;
  TITAN_CHECK(v->is_boolean(), where_, ": ", name(key), " must be true or false, got ",
              json_excerpt(*v));
  return v->get<bool>();
}

std::string Fields::string(const char* key, const std::string& fallback) const {
  const json* v = get(key);
  if (v == nullptr) return fallback;
  TITAN_CHECK(v->is_string(), where_, ": ", name(key), " must be a string, got ", json_excerpt(*v));
  return v->get<std::string>();
}

int64_t Fields::token(const char* key, int64_t vocab_size) const {
  const json* v = get(key);
  return v == nullptr ? -1 : checked_token(*v, name(key), vocab_size);
}

std::vector<int64_t> Fields::tokens(const char* key, int64_t vocab_size) const {
  const json* v = get(key);
  std::vector<int64_t> ids;
  if (v == nullptr) return ids;
  if (!v->is_array()) return {checked_token(*v, name(key), vocab_size)};
  for (const json& id : *v) ids.push_back(checked_token(id, name(key), vocab_size));
  return ids;
}

int64_t Fields::checked_size(const json& v, const std::string& field) const {
  const int64_t n = integer(v, field);
  TITAN_CHECK(n >= 1 && n <= kMaxDim, where_, ": ", field, " must be in [1, ", kMaxDim, "], got ",
              n);
  return n;
}

int64_t Fields::checked_token(const json& v, const std::string& field, int64_t vocab_size) const {
  const int64_t id = integer(v, field);
  TITAN_CHECK(id >= 0 && id < vocab_size, where_, ": ", field, " ", id,
              " is not a token id below vocab_size ", vocab_size);
  return id;
}

ModelArgs read_common(const Fields& f, const ClassDefaults& defaults) {
  ModelArgs a;
  a.vocab_size = f.size("vocab_size");
  a.hidden_size = f.size("hidden_size");
  a.num_hidden_layers = f.size("num_hidden_layers");
  a.num_attention_heads = f.size("num_attention_heads");
  a.num_key_value_heads = defaults.kv_heads_default_to_heads
                              ? f.size("num_key_value_heads", a.num_attention_heads)
                              : f.size("num_key_value_heads");
  if (f.get("head_dim") != nullptr) {
    a.head_dim = f.size("head_dim");
  } else if (defaults.head_dim > 0) {
    a.head_dim = defaults.head_dim;
  } else {
    TITAN_CHECK(a.hidden_size % a.num_attention_heads == 0, f.where(), ": head_dim is absent and ",
                "hidden_size ", a.hidden_size, " is not divisible by num_attention_heads ",
                a.num_attention_heads);
    a.head_dim = a.hidden_size / a.num_attention_heads;
  }
  a.max_position_embeddings = f.size("max_position_embeddings", defaults.max_position_embeddings);
  read_rope(f, a);
  a.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  a.initializer_range = f.number("initializer_range", 0.02);
  a.tie_word_embeddings = f.boolean("tie_word_embeddings", false);  // every class's default
  a.bos_token_id =
      f.present("bos_token_id") ? f.token("bos_token_id", a.vocab_size) : defaults.bos_token_id;
  a.eos_token_ids =
      f.present("eos_token_id") ? f.tokens("eos_token_id", a.vocab_size) : defaults.eos_token_ids;
  a.pad_token_id = f.token("pad_token_id", a.vocab_size);
  TITAN_CHECK(f.string("hidden_act", "silu") == "silu", f.where(), ": hidden_act ",
              json_quote(f.string("hidden_act", "")), " is not supported (silu)");
  TITAN_CHECK(f.number("attention_dropout", 0.0) == 0.0, f.where(),
              ": attention_dropout other than 0 is not supported");
  return a;
}

void refuse_sliding_window(const Fields& f, const ModelArgs& a) {
  TITAN_CHECK(!f.boolean("use_sliding_window", false), f.where(),
              ": use_sliding_window = true is not supported");
  if (const json* types = f.get("layer_types")) {
    TITAN_CHECK(types->is_array() && static_cast<int64_t>(types->size()) == a.num_hidden_layers,
                f.where(), ": layer_types must list ", a.num_hidden_layers, " layer types");
    for (const json& t : *types) {
      TITAN_CHECK(t == "full_attention", f.where(), ": layer_types entry ", json_excerpt(t),
                  " is not supported (full_attention)");
    }
  }
}

json common_config_json(const ModelArgs& a, const char* model_type, DType weights_dtype) {
  json c;
  c["architectures"] = {a.architecture};
  c["model_type"] = model_type;
  c["torch_dtype"] = c["dtype"] = torch_dtype_name(weights_dtype);
  c["vocab_size"] = a.vocab_size;
  c["hidden_size"] = a.hidden_size;
  c["intermediate_size"] = a.intermediate_size;
  c["num_hidden_layers"] = a.num_hidden_layers;
  c["num_attention_heads"] = a.num_attention_heads;
  c["num_key_value_heads"] = a.num_key_value_heads;
  c["head_dim"] = a.head_dim;
  c["hidden_act"] = "silu";
  c["max_position_embeddings"] = a.max_position_embeddings;
  c["initializer_range"] = a.initializer_range;
  c["rms_norm_eps"] = a.rms_norm_eps;
  c["use_cache"] = true;
  c["tie_word_embeddings"] = a.tie_word_embeddings;
  c["attention_dropout"] = 0.0;
  c["bos_token_id"] = id_json(a.bos_token_id);
  c["eos_token_id"] = ids_json(a.eos_token_ids);
  c["pad_token_id"] = id_json(a.pad_token_id);
  const json scaling = rope_scaling_json(a.rope_scaling);
  c["rope_theta"] = a.rope_theta;
  c["rope_scaling"] = scaling;
  json parameters = scaling.is_null() ? json{{"rope_type", "default"}} : scaling;
  parameters["rope_theta"] = a.rope_theta;
  c["rope_parameters"] = parameters;
  return c;
}

json ids_json(const std::vector<int64_t>& ids) {
  if (ids.empty()) return nullptr;
  if (ids.size() == 1) return ids[0];
  return ids;
}

json id_json(int64_t id) {
  return id < 0 ? json(nullptr) : json(id);
}

void write_no_sliding_window(const ModelArgs& a, json& c, bool layer_types) {
  c["use_sliding_window"] = false;
  c["sliding_window"] = nullptr;
  c["max_window_layers"] = a.num_hidden_layers;
  if (layer_types) {
    c["layer_types"] =
        std::vector<std::string>(static_cast<size_t>(a.num_hidden_layers), "full_attention");
  }
}

}  // namespace titan::hf
