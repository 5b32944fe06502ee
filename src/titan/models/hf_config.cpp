#include "titan/models/hf_config.h"

#include <filesystem>
#include <limits>

#include "titan/core/error.h"
#include "titan/io/atomic_file.h"
#include "titan/io/json_util.h"

namespace titan {
namespace {

using json = nlohmann::json;

constexpr const char* kDense = "Qwen3ForCausalLM";
constexpr const char* kMoe = "Qwen3MoeForCausalLM";
// Dims beyond int32 are not a real model, and refusing them keeps every product of two dims
// (parameter counts, buffer sizes) far from int64 overflow.
constexpr int64_t kMaxDim = std::numeric_limits<int32_t>::max();
// HF's default_theta when a config names no rope_theta anywhere.
constexpr double kDefaultTheta = 10000.0;

// Typed access to one JSON object's fields; every error names the file and the field.
class Fields {
 public:
  Fields(const json& object, std::string where, std::string prefix = "")
      : j_(object), where_(std::move(where)), prefix_(std::move(prefix)) {}

  // nullptr when absent or null (HF treats both as "not set").
  const json* get(const char* key) const {
    const auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  std::string name(const char* key) const { return prefix_ + key; }
  const std::string& where() const { return where_; }

  int64_t integer(const json& v, const std::string& field) const {
    TITAN_CHECK(v.is_number_integer(), where_, ": ", field, " must be an integer, got ",
                json_excerpt(v));
    TITAN_CHECK(!v.is_number_unsigned() ||
                    v.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()),
                where_, ": ", field, " is out of range: ", json_excerpt(v));
    return v.get<int64_t>();
  }
  // A dimension or count: required, an integer in [1, kMaxDim].
  int64_t size(const char* key) const {
    const json* v = get(key);
    TITAN_CHECK(v != nullptr, where_, ": ", name(key), " is missing");
    return checked_size(*v, name(key));
  }
  int64_t size(const char* key, int64_t fallback) const {
    const json* v = get(key);
    return v == nullptr ? fallback : checked_size(*v, name(key));
  }
  double number(const char* key, double fallback) const {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    TITAN_CHECK(v->is_number(), where_, ": ", name(key), " must be a number, got ",
                json_excerpt(*v));
    return v->get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    TITAN_CHECK(v->is_boolean(), where_, ": ", name(key), " must be true or false, got ",
                json_excerpt(*v));
    return v->get<bool>();
  }
  std::string string(const char* key, const std::string& fallback) const {
    const json* v = get(key);
    if (v == nullptr) return fallback;
    TITAN_CHECK(v->is_string(), where_, ": ", name(key), " must be a string, got ",
                json_excerpt(*v));
    return v->get<std::string>();
  }
  // A token id: absent/null -> -1, else an integer in [0, vocab_size).
  int64_t token(const char* key, int64_t vocab_size) const {
    const json* v = get(key);
    return v == nullptr ? -1 : checked_token(*v, name(key), vocab_size);
  }
  // An id or a list of ids (eos_token_id).
  std::vector<int64_t> tokens(const char* key, int64_t vocab_size) const {
    const json* v = get(key);
    std::vector<int64_t> ids;
    if (v == nullptr) return ids;
    if (!v->is_array()) return {checked_token(*v, name(key), vocab_size)};
    for (const json& id : *v) ids.push_back(checked_token(id, name(key), vocab_size));
    return ids;
  }

 private:
  int64_t checked_size(const json& v, const std::string& field) const {
    const int64_t n = integer(v, field);
    TITAN_CHECK(n >= 1 && n <= kMaxDim, where_, ": ", field, " must be in [1, ", kMaxDim, "], got ",
                n);
    return n;
  }
  int64_t checked_token(const json& v, const std::string& field, int64_t vocab_size) const {
    const int64_t id = integer(v, field);
    TITAN_CHECK(id >= 0 && id < vocab_size, where_, ": ", field, " ", id,
                " is not a token id below vocab_size ", vocab_size);
    return id;
  }

  const json& j_;
  std::string where_;
  std::string prefix_;
};

// The architecture from `architectures` and `model_type`, which must agree when both are given.
std::string read_architecture(const Fields& f) {
  const std::string model_type = f.string("model_type", "");
  TITAN_CHECK(model_type.empty() || model_type == "qwen3" || model_type == "qwen3_moe", f.where(),
              ": model_type ", json_quote(model_type), " is not supported (qwen3 or qwen3_moe)");
  std::string arch;
  if (const json* list = f.get("architectures")) {
    TITAN_CHECK(list->is_array() && list->size() == 1 && (*list)[0].is_string(), f.where(),
                ": architectures must be a list of one name, got ", json_excerpt(*list));
    arch = (*list)[0].get<std::string>();
    TITAN_CHECK(arch == kDense || arch == kMoe, f.where(), ": architecture ", json_quote(arch),
                " is not supported (", kDense, " or ", kMoe, ")");
  } else {
    TITAN_CHECK(!model_type.empty(), f.where(), ": neither architectures nor model_type is set");
    arch = model_type == "qwen3" ? kDense : kMoe;
  }
  const std::string expected_type = arch == kDense ? "qwen3" : "qwen3_moe";
  TITAN_CHECK(model_type.empty() || model_type == expected_type, f.where(), ": model_type '",
              model_type, "' does not match architecture ", arch, " ('", expected_type, "')");
  return arch;
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
                " has per-layer-type entries other than full_attention, which Qwen3 does not use");
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
  TITAN_CHECK(type == "yarn", f.where(), ": ", r.name("rope_type"), " ", json_quote(type),
              " is not supported (default or yarn)");
  a.rope_scaling.type = "yarn";
  TITAN_CHECK(r.get("factor") != nullptr, f.where(), ": ", r.name("factor"),
              " is missing (yarn needs it)");
  a.rope_scaling.factor = r.number("factor", 1.0);
  a.rope_scaling.original_max_position_embeddings =
      r.size("original_max_position_embeddings", a.max_position_embeddings);
  a.rope_scaling.attention_factor = r.number("attention_factor", 0.0);
  // HF reads these with `or`, so 0 means the default too.
  const double beta_fast = r.number("beta_fast", 32.0);
  const double beta_slow = r.number("beta_slow", 1.0);
  a.rope_scaling.beta_fast = beta_fast == 0 ? 32.0 : beta_fast;
  a.rope_scaling.beta_slow = beta_slow == 0 ? 1.0 : beta_slow;
  for (const char* key : {"mscale", "mscale_all_dim"}) {
    TITAN_CHECK(r.get(key) == nullptr, f.where(), ": ", r.name(key),
                " is not supported for Qwen3 yarn");
  }
  TITAN_CHECK(r.boolean("truncate", true), f.where(), ": ", r.name("truncate"),
              " = false is not supported");
}

// Features HF implements that titan does not; a config that turns one on is refused, never
// silently computed differently.
void refuse_unsupported(const Fields& f, const ModelArgs& a) {
  TITAN_CHECK(f.string("hidden_act", "silu") == "silu", f.where(), ": hidden_act ",
              json_quote(f.string("hidden_act", "")), " is not supported (silu)");
  TITAN_CHECK(!f.boolean("use_sliding_window", false), f.where(),
              ": use_sliding_window = true is not supported");
  TITAN_CHECK(f.number("attention_dropout", 0.0) == 0.0, f.where(),
              ": attention_dropout other than 0 is not supported");
  if (const json* types = f.get("layer_types")) {
    TITAN_CHECK(types->is_array() && static_cast<int64_t>(types->size()) == a.num_hidden_layers,
                f.where(), ": layer_types must list ", a.num_hidden_layers, " layer types");
    for (const json& t : *types) {
      TITAN_CHECK(t == "full_attention", f.where(), ": layer_types entry ", json_excerpt(t),
                  " is not supported (full_attention)");
    }
  }
}

void read_moe(const Fields& f, ModelArgs& a) {
  const json* experts = f.get("num_experts");
  const json* local = f.get("num_local_experts");
  TITAN_CHECK(experts == nullptr || local == nullptr || *experts == *local, f.where(),
              ": num_experts and num_local_experts disagree");
  a.num_experts = experts != nullptr ? f.size("num_experts") : f.size("num_local_experts");
  a.num_experts_per_tok = f.size("num_experts_per_tok");
  a.moe_intermediate_size = f.size("moe_intermediate_size");
  a.norm_topk_prob = f.boolean("norm_topk_prob", false);  // HF's class default
  a.router_aux_loss_coef = f.number("router_aux_loss_coef", 0.001);
  a.output_router_logits = f.boolean("output_router_logits", false);
  a.decoder_sparse_step = f.size("decoder_sparse_step", 1);
  a.mlp_only_layers.clear();
  if (const json* dense_layers = f.get("mlp_only_layers")) {
    TITAN_CHECK(dense_layers->is_array(), f.where(), ": mlp_only_layers must be a list");
    for (const json& layer : *dense_layers) {
      a.mlp_only_layers.push_back(f.integer(layer, "mlp_only_layers"));
    }
  }
}

}  // namespace

ModelArgs model_args_from_hf_config(const json& config, const std::string& where) {
  TITAN_CHECK(config.is_object(), where, ": config is ", config.type_name(), ", not an object");
  const Fields f(config, where);
  ModelArgs a;
  a.architecture = read_architecture(f);
  a.vocab_size = f.size("vocab_size");
  a.hidden_size = f.size("hidden_size");
  a.num_hidden_layers = f.size("num_hidden_layers");
  a.num_attention_heads = f.size("num_attention_heads");
  a.num_key_value_heads = f.size("num_key_value_heads");
  if (f.get("head_dim") != nullptr) {
    a.head_dim = f.size("head_dim");
  } else {
    TITAN_CHECK(a.hidden_size % a.num_attention_heads == 0, where, ": head_dim is absent and ",
                "hidden_size ", a.hidden_size, " is not divisible by num_attention_heads ",
                a.num_attention_heads);
    a.head_dim = a.hidden_size / a.num_attention_heads;
  }
  a.max_position_embeddings = f.size("max_position_embeddings", 32768);
  read_rope(f, a);
  a.rms_norm_eps = f.number("rms_norm_eps", 1e-6);
  a.initializer_range = f.number("initializer_range", 0.02);
  a.tie_word_embeddings = f.boolean("tie_word_embeddings", false);  // HF's class default
  a.attention_bias = f.boolean("attention_bias", false);
  a.bos_token_id = f.token("bos_token_id", a.vocab_size);
  a.eos_token_ids = f.tokens("eos_token_id", a.vocab_size);
  a.pad_token_id = f.token("pad_token_id", a.vocab_size);
  if (a.architecture == kMoe) {
    read_moe(f, a);
    // The dense width matters only for layers kept dense; HF's class default otherwise.
    bool any_dense = false;
    for (int64_t layer = 0; layer < a.num_hidden_layers; ++layer) {
      any_dense = any_dense || !a.layer_is_sparse(layer);
    }
    a.intermediate_size =
        any_dense ? f.size("intermediate_size") : f.size("intermediate_size", 6144);
  } else {
    a.intermediate_size = f.size("intermediate_size");
    a.num_experts = 0;
  }
  refuse_unsupported(f, a);
  validate_model_args(a, where);
  return a;
}

ModelArgs read_hf_config(const std::string& path) {
  const std::string file = std::filesystem::is_directory(path)
                               ? (std::filesystem::path(path) / "config.json").string()
                               : path;
  return model_args_from_hf_config(read_json_file(file, "config.json", 8), file);
}

std::string torch_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32:
      return "float32";
    case DType::bf16:
      return "bfloat16";
    case DType::f16:
      return "float16";
    default:
      fail("weights cannot be stored as ", dtype_name(dtype), " (float32, bfloat16 or float16)");
  }
}

namespace {

json ids_json(const std::vector<int64_t>& ids) {
  if (ids.empty()) return nullptr;
  if (ids.size() == 1) return ids[0];
  return ids;
}

json id_json(int64_t id) {
  return id < 0 ? json(nullptr) : json(id);
}

}  // namespace

json hf_config_json(const ModelArgs& a, DType weights_dtype) {
  validate_model_args(a, "config.json");
  const bool moe = a.is_moe();
  json c;
  c["architectures"] = {moe ? kMoe : kDense};
  c["model_type"] = moe ? "qwen3_moe" : "qwen3";
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
  c["attention_bias"] = a.attention_bias;
  c["attention_dropout"] = 0.0;
  c["use_sliding_window"] = false;
  c["sliding_window"] = nullptr;
  c["max_window_layers"] = a.num_hidden_layers;
  // Qwen3MoeConfig has no layer_types: given one, Transformers 5.23's generate builds a mask per
  // layer type that Qwen3MoeModel cannot take (static-cache generation fails).
  if (!moe) {
    c["layer_types"] =
        std::vector<std::string>(static_cast<size_t>(a.num_hidden_layers), "full_attention");
  }
  c["bos_token_id"] = id_json(a.bos_token_id);
  c["eos_token_id"] = ids_json(a.eos_token_ids);
  c["pad_token_id"] = id_json(a.pad_token_id);

  json scaling = nullptr;
  if (a.rope_scaling.type == "yarn") {
    scaling = {
        {"rope_type", "yarn"},
        {"factor", a.rope_scaling.factor},
        {"original_max_position_embeddings", a.rope_scaling.original_max_position_embeddings},
        {"beta_fast", a.rope_scaling.beta_fast},
        {"beta_slow", a.rope_scaling.beta_slow}};
    if (a.rope_scaling.attention_factor > 0) {
      scaling["attention_factor"] = a.rope_scaling.attention_factor;
    }
  }
  c["rope_theta"] = a.rope_theta;
  c["rope_scaling"] = scaling;
  json parameters = scaling.is_null() ? json{{"rope_type", "default"}} : scaling;
  parameters["rope_theta"] = a.rope_theta;
  c["rope_parameters"] = parameters;

  if (moe) {
    c["num_experts"] = a.num_experts;
    c["num_experts_per_tok"] = a.num_experts_per_tok;
    c["moe_intermediate_size"] = a.moe_intermediate_size;
    c["norm_topk_prob"] = a.norm_topk_prob;
    c["router_aux_loss_coef"] = a.router_aux_loss_coef;
    c["output_router_logits"] = a.output_router_logits;
    c["decoder_sparse_step"] = a.decoder_sparse_step;
    c["mlp_only_layers"] = a.mlp_only_layers;
  }
  return c;
}

void write_hf_config(const std::string& path, const ModelArgs& args, DType weights_dtype) {
  write_file_atomic(path, hf_config_json(args, weights_dtype).dump(2) + "\n");
}

GenerationConfig default_generation_config(const ModelArgs& args) {
  GenerationConfig g;
  g.bos_token_id = args.bos_token_id;
  g.eos_token_ids = args.eos_token_ids;
  g.pad_token_id = args.pad_token_id;
  return g;
}

json hf_generation_config_json(const GenerationConfig& g) {
  json j;
  j["bos_token_id"] = id_json(g.bos_token_id);
  j["eos_token_id"] = ids_json(g.eos_token_ids);
  if (g.pad_token_id >= 0) j["pad_token_id"] = g.pad_token_id;
  j["do_sample"] = g.do_sample;
  // Sampling knobs only when sampling: HF warns about them under greedy decoding.
  if (g.do_sample) {
    j["temperature"] = g.temperature;
    j["top_p"] = g.top_p;
    j["top_k"] = g.top_k;
  }
  return j;
}

void write_hf_generation_config(const std::string& path, const GenerationConfig& g) {
  write_file_atomic(path, hf_generation_config_json(g).dump(2) + "\n");
}

GenerationConfig read_hf_generation_config(const std::string& path) {
  const json j = read_json_file(path, "generation_config.json", 4);
  TITAN_CHECK(j.is_object(), path, ": generation config is ", j.type_name(), ", not an object");
  const Fields f(j, path);
  constexpr int64_t kAnyVocab = std::numeric_limits<int64_t>::max();
  GenerationConfig g;
  g.bos_token_id = f.token("bos_token_id", kAnyVocab);
  g.eos_token_ids = f.tokens("eos_token_id", kAnyVocab);
  g.pad_token_id = f.token("pad_token_id", kAnyVocab);
  g.do_sample = f.boolean("do_sample", g.do_sample);
  g.temperature = f.number("temperature", g.temperature);
  g.top_p = f.number("top_p", g.top_p);
  if (const json* k = f.get("top_k")) g.top_k = f.integer(*k, "top_k");
  TITAN_CHECK(g.top_k >= 0, path, ": top_k must not be negative");
  TITAN_CHECK(g.temperature > 0, path, ": temperature must be positive");
  TITAN_CHECK(g.top_p > 0 && g.top_p <= 1, path, ": top_p must be in (0, 1]");
  return g;
}

}  // namespace titan
