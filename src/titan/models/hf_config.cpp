#include "titan/models/hf_config.h"

#include <filesystem>
#include <limits>

#include "titan/core/error.h"
#include "titan/io/atomic_file.h"
#include "titan/io/json_util.h"
#include "titan/models/hf_config_common.h"
#include "titan/models/registry.h"

namespace titan {
namespace {

using json = nlohmann::json;

std::string known_model_types() {
  std::string types;
  for (const ModelFamily& family : model_families()) {
    types += (types.empty() ? "" : ", ") + std::string(family.model_type);
  }
  return types;
}

// The family from `architectures` and `model_type`, which must agree when both are given.
const ModelFamily& read_family(const hf::Fields& f) {
  const std::string model_type = f.string("model_type", "");
  const ModelFamily* by_type = model_family_by_type(model_type);
  TITAN_CHECK(model_type.empty() || by_type != nullptr, f.where(), ": model_type ",
              json_quote(model_type), " is not supported (", known_model_types(), ")");
  const json* list = f.get("architectures");
  if (list == nullptr) {
    TITAN_CHECK(by_type != nullptr, f.where(), ": neither architectures nor model_type is set");
    return *by_type;
  }
  TITAN_CHECK(list->is_array() && list->size() == 1 && (*list)[0].is_string(), f.where(),
              ": architectures must be a list of one name, got ", json_excerpt(*list));
  const ModelFamily& family = model_family((*list)[0].get<std::string>(), f.where());
  TITAN_CHECK(by_type == nullptr || by_type == &family, f.where(), ": model_type '", model_type,
              "' does not match architecture ", family.architecture, " ('", family.model_type,
              "')");
  return family;
}

}  // namespace

ModelArgs model_args_from_hf_config(const json& config, const std::string& where) {
  TITAN_CHECK(config.is_object(), where, ": config is ", config.type_name(), ", not an object");
  const hf::Fields f(config, where);
  const ModelFamily& family = read_family(f);
  ModelArgs a = family.read_config(f);
  a.architecture = family.architecture;
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

json hf_config_json(const ModelArgs& a, DType weights_dtype) {
  validate_model_args(a, "config.json");
  return model_family(a.architecture, "config.json").write_config(a, weights_dtype);
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
  j["bos_token_id"] = hf::id_json(g.bos_token_id);
  j["eos_token_id"] = hf::ids_json(g.eos_token_ids);
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
  const hf::Fields f(j, path);
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
