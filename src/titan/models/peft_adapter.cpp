#include "titan/models/peft_adapter.h"

#include <algorithm>
#include <filesystem>
#include <set>

#include <nlohmann/json.hpp>

#include "titan/backend/backend.h"
#include "titan/core/allocator.h"
#include "titan/core/error.h"
#include "titan/io/atomic_dir.h"
#include "titan/io/atomic_file.h"
#include "titan/io/convert.h"
#include "titan/io/json_util.h"
#include "titan/io/safetensors.h"
#include "titan/io/safetensors_writer.h"
#include "titan/nn/host_params.h"
#include "titan/nn/shard_runs.h"

namespace titan {
namespace fs = std::filesystem;
namespace {

constexpr const char* kPeftPrefix = "base_model.model.";
constexpr const char* kConfigFile = "adapter_config.json";
constexpr const char* kWeightsFile = "adapter_model.safetensors";
constexpr int kConfigDepth = 8;
// The rank_pattern / alpha_pattern key PEFT gives the fused gate_up_proj.
constexpr const char* kGateUpPattern = ".*\\.gate_up_proj";

// A key of adapter_config.json that must be absent, null, false or empty for titan to compute
// what PEFT does.
void require_unset(const nlohmann::json& config, const std::string& path, const char* key,
                   const char* why) {
  if (!config.contains(key)) return;
  const nlohmann::json& v = config[key];
  const bool unset = v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
                     (v.is_object() && v.empty()) || (v.is_array() && v.empty()) ||
                     (v.is_string() && (v.get<std::string>() == "none" || v.empty()));
  TITAN_CHECK(unset, path, ": \"", key, "\" is ", json_excerpt(v), " (", why, " is not supported)");
}

}  // namespace

LoraOptions read_peft_adapter_config(const std::string& dir) {
  TITAN_CHECK(fs::is_directory(dir), dir, ": no such adapter folder");
  const std::string path = (fs::path(dir) / kConfigFile).string();
  TITAN_CHECK(fs::is_regular_file(path), dir, ": not a PEFT adapter folder (no ", kConfigFile, ")");
  const nlohmann::json config = read_json_file(path, "adapter config", kConfigDepth);
  TITAN_CHECK(config.is_object(), path, ": not a JSON object");
  const auto field = [&](const char* key) -> const nlohmann::json& {
    TITAN_CHECK(config.contains(key), path, ": no \"", key, "\"");
    return config[key];
  };
  const nlohmann::json& type = field("peft_type");
  TITAN_CHECK(type.is_string() && type.get<std::string>() == "LORA", path, ": \"peft_type\" is ",
              json_excerpt(type), ", not \"LORA\"");
  LoraOptions options;
  const nlohmann::json& r = field("r");
  TITAN_CHECK(r.is_number_integer() && r.get<int64_t>() >= 1, path, ": \"r\" is ", json_excerpt(r),
              " (a positive integer)");
  options.rank = r.get<int64_t>();
  const nlohmann::json& alpha = field("lora_alpha");
  TITAN_CHECK(alpha.is_number(), path, ": \"lora_alpha\" is ", json_excerpt(alpha), " (a number)");
  options.alpha = alpha.get<double>();
  const nlohmann::json& targets = field("target_modules");
  TITAN_CHECK(targets.is_array(), path, ": \"target_modules\" is ", json_excerpt(targets),
              " (a list of module names; a regular expression is not supported)");
  std::string list;
  for (const nlohmann::json& t : targets) {
    TITAN_CHECK(t.is_string(), path, ": \"target_modules\" holds ", json_excerpt(t));
    // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on "," + std::string.
    if (!list.empty()) list += ',';
    list += t.get<std::string>();
  }
  // A MoE model's adapter (PEFT on Transformers 5) names the experts' stacked parameters in
  // target_parameters: gate_up_proj (gate_proj and up_proj fused, its rank and alpha doubled by
  // rank_pattern and alpha_pattern) and down_proj.
  bool gate_up = false;
  if (config.contains("target_parameters") && !config["target_parameters"].is_null()) {
    const nlohmann::json& params = config["target_parameters"];
    TITAN_CHECK(params.is_array(), path, ": \"target_parameters\" is ", json_excerpt(params),
                " (a list of parameter names)");
    for (const nlohmann::json& t : params) {
      const std::string name = t.is_string() ? t.get<std::string>() : "";
      TITAN_CHECK(name == "gate_up_proj" || name == "down_proj", path,
                  ": \"target_parameters\" holds ", json_excerpt(t),
                  " (gate_up_proj or down_proj: a Qwen3-MoE's experts)");
      gate_up = gate_up || name == "gate_up_proj";
      list += (list.empty() ? "" : ",") +
              (name == "gate_up_proj" ? std::string("gate_proj,up_proj") : name);
    }
  }
  options.target_modules = parse_lora_targets(list, path + ": \"target_modules\"");
  if (gate_up) {
    const auto doubled = [&](const char* key, double value) {
      const nlohmann::json want = {{kGateUpPattern, value}};
      TITAN_CHECK(config.contains(key) && config[key].is_object() && config[key].size() == 1 &&
                      config[key].contains(kGateUpPattern) &&
                      config[key][kGateUpPattern].is_number() &&
                      config[key][kGateUpPattern].get<double>() == value,
                  path, ": \"", key, "\" is ",
                  config.contains(key) ? json_excerpt(config[key]) : std::string("absent"),
                  "; gate_up_proj's fused pair needs ", want.dump(), " (PEFT's conversion)");
    };
    doubled("rank_pattern", 2.0 * static_cast<double>(options.rank));
    doubled("alpha_pattern", 2.0 * options.alpha);
  } else {
    require_unset(config, path, "rank_pattern", "a rank per module");
    require_unset(config, path, "alpha_pattern", "an alpha per module");
  }
  require_unset(config, path, "use_dora", "DoRA");
  require_unset(config, path, "use_rslora", "rsLoRA's scaling alpha / sqrt(r)");
  require_unset(config, path, "fan_in_fan_out", "fan_in_fan_out");
  require_unset(config, path, "bias", "a trained bias");
  require_unset(config, path, "lora_bias", "a trained bias");
  require_unset(config, path, "layers_to_transform", "adapting only some layers");
  require_unset(config, path, "modules_to_save", "training whole modules");
  return options;
}

void load_peft_adapter(const std::string& dir, LoraAdapter& adapter) {
  const std::string path = (fs::path(dir) / kWeightsFile).string();
  TITAN_CHECK(fs::is_regular_file(path), dir, ": no ", kWeightsFile);
  const SafetensorsFile file = SafetensorsFile::open(path);
  std::set<std::string> expected;
  for (const ParamGroup& g : adapter.groups()) {
    for (const ParamView& v : g.views()) expected.insert(kPeftPrefix + v.spec.name);
  }
  for (const SafetensorsEntry& e : file.entries()) {
    TITAN_CHECK(expected.count(e.name) == 1, path, ": tensor ", json_quote(e.name),
                " is not a parameter of this model's adapter (rank ", adapter.options().rank,
                " on its ", adapter.specs().size(), " layers)");
  }
  // Converted on the host: into the groups themselves, or into host copies a device's groups are
  // then copied from (every tensor of the adapter is read, so none is left zero).
  write_params_on_host(adapter.groups(), false, [&](std::vector<ParamGroup>& groups) {
    for (size_t i = 0; i < adapter.specs().size(); ++i) {
      ParamGroup& g = groups[i];
      for (const ParamSpec& whole : adapter.specs()[i].params) {
        const std::string key = kPeftPrefix + whole.name;
        const SafetensorsEntry* e = file.find(key);
        TITAN_CHECK(e != nullptr, path, ": no tensor ", key,
                    " (the adapter does not fit the model)");
        TITAN_CHECK(e->shape == whole.shape, path, ": ", key, " has shape ", shape_str(e->shape),
                    ", the model's adapter ", shape_str(whole.shape));
        TITAN_CHECK(e->dtype == DType::f32 || e->dtype == DType::bf16 || e->dtype == DType::f16,
                    path, ": ", key, " is ", e->dtype_name, " (F32, BF16 or F16)");
        const ParamView& v = g.view(whole.name);
        float* own = g.params() + v.offset;
        const Shard cut = adapter.plan().placement_of(whole);
        if (cut.count == 1) {
          convert_to_f32(e->data, *e->dtype, static_cast<size_t>(v.numel), own);
          continue;
        }
        // Under tensor parallel: the whole tensor read, this rank's cut kept.
        std::vector<float> values(static_cast<size_t>(shape_numel(whole.shape)));
        convert_to_f32(e->data, *e->dtype, values.size(), values.data());
        copy_part_out(shard_box(whole.shape, {cut}), values.data(), own);
      }
    }
  });
}

namespace {

// The adapter's tensors as adapter_model.safetensors holds them (whole), and per tensor its group
// and parameter: each viewing `room` (gathered into it just before it is read), or with a null
// room the groups' own values (whole: no cut).
struct AdapterTensors {
  std::vector<SafetensorsTensor> tensors;
  std::vector<std::pair<size_t, std::string>> params;
};
AdapterTensors adapter_tensors(const LoraAdapter& adapter, float* room) {
  AdapterTensors out;
  for (size_t i = 0; i < adapter.specs().size(); ++i) {
    const ParamGroup& g = adapter.groups()[i];
    for (const ParamSpec& p : adapter.specs()[i].params) {
      const ParamView& v = g.view(p.name);
      TITAN_CHECK(room != nullptr || v.spec.shape == p.shape, "PEFT adapter: ", p.name,
                  " is cut (tensor parallel) and no gather brings it whole");
      out.tensors.push_back(
          {kPeftPrefix + p.name,
           Tensor::view(room != nullptr ? room : g.params() + v.offset, p.shape, DType::f32)});
      out.params.emplace_back(i, p.name);
    }
  }
  return out;
}

}  // namespace

std::vector<std::pair<size_t, std::string>> peft_adapter_read_order(const LoraAdapter& adapter) {
  float unused = 0.0f;  // the order looks at names, shapes and dtypes only
  const AdapterTensors all = adapter_tensors(adapter, &unused);
  std::vector<std::pair<size_t, std::string>> order;
  for (size_t i : safetensors_file_read_order(all.tensors, SafetensorsWriteOptions())) {
    order.push_back(all.params[i]);
  }
  return order;
}

void write_peft_adapter(const std::string& dir, const LoraAdapter& adapter,
                        const std::string& base_model, bool overwrite,
                        const AdapterTensorGather& gather) {
  AtomicDir out(dir, "peft adapter", overwrite);
  Buffer room;  // gathered: one tensor whole at a time, room for the largest
  if (gather) {
    int64_t largest = 0;
    for (const ParamGroupSpec& g : adapter.specs()) {
      for (const ParamSpec& p : g.params) largest = std::max(largest, shape_numel(p.shape));
    }
    room = Buffer(backend().memory(), static_cast<size_t>(largest) * sizeof(float),
                  MemCategory::other);
  }
  const AdapterTensors all = adapter_tensors(adapter, gather ? room.as<float>() : nullptr);
  SafetensorsWriteOptions write;
  // A device's adapter (and gather room) read a tensor at a time through the backend's copies.
  if (in_device_memory(adapter.groups())) read_through_backend(write);
  if (gather) {
    write.before_read = [&](size_t i) {
      gather(all.params[i].first, all.params[i].second, room.as<float>());
    };
  }
  write_safetensors_file((fs::path(out.staging()) / kWeightsFile).string(), all.tensors, write);
  const LoraOptions& o = adapter.options();
  // A MoE model's MLP targets are the experts' stacked parameters, as PEFT converts them.
  std::vector<std::string> modules, parameters;
  for (const std::string& t : o.target_modules) {
    const bool mlp = t == "gate_proj" || t == "up_proj" || t == "down_proj";
    if (!adapter.moe() || !mlp) modules.push_back(t);
  }
  if (adapter.moe() && o.targets("gate_proj")) parameters.push_back("gate_up_proj");
  if (adapter.moe() && o.targets("down_proj")) parameters.push_back("down_proj");
  nlohmann::json config = {
      {"peft_type", "LORA"},
      {"task_type", "CAUSAL_LM"},
      {"base_model_name_or_path", base_model},
      {"r", o.rank},
      {"lora_alpha", o.alpha},
      {"lora_dropout", o.dropout},
      {"target_modules", modules},
      {"bias", "none"},
      {"fan_in_fan_out", false},
      {"use_rslora", false},
      {"use_dora", false},
      {"init_lora_weights", true},
      {"inference_mode", true},
      {"modules_to_save", nullptr},
      {"layers_to_transform", nullptr},
  };
  if (!parameters.empty()) {
    config["target_parameters"] = parameters;
    if (o.targets("gate_proj")) {
      config["rank_pattern"] = {{kGateUpPattern, 2 * o.rank}};
      config["alpha_pattern"] = {{kGateUpPattern, 2 * o.alpha}};
    }
  }
  write_file_atomic((fs::path(out.staging()) / kConfigFile).string(), config.dump(2) + "\n");
  out.commit();
}

namespace {

// W (out x in) += scaling B A.
void merge_linear(const LoraLinear& l, float* w) {
  // A load-time step of out x in x rank products, not a training op: plain loops, summed in
  // fp64 and added once.
#pragma omp parallel for schedule(static)
  for (int64_t o = 0; o < l.out_features; ++o) {
    for (int64_t i = 0; i < l.in_features; ++i) {
      double sum = 0.0;
      for (int64_t r = 0; r < l.rank; ++r) {
        sum += static_cast<double>(l.b[o * l.rank + r]) * l.a[r * l.in_features + i];
      }
      w[o * l.in_features + i] += static_cast<float>(sum * l.scaling);
    }
  }
}

// w (E, out, in) += scaling * B_e A_e of one stacked expert weight (ops/lora_experts.h's layout;
// b and its row stride rank * E as there), summed in fp64 as merge_linear's.
void merge_experts(float* w, const ExpertLoraPair& p, int64_t b_row0, int64_t n_experts, int64_t in,
                   int64_t out, float scaling) {
  const int64_t stride = p.rank * n_experts;
#pragma omp parallel for collapse(2) schedule(static)
  for (int64_t e = 0; e < n_experts; ++e) {
    for (int64_t o = 0; o < out; ++o) {
      for (int64_t i = 0; i < in; ++i) {
        double sum = 0.0;
        for (int64_t j = 0; j < p.rank; ++j) {
          sum += static_cast<double>(p.b[(b_row0 + o) * stride + j * n_experts + e]) *
                 p.a[(e * p.rank + j) * in + i];
        }
        w[(e * out + o) * in + i] += static_cast<float>(sum * scaling);
      }
    }
  }
}

// Merges every weight `adapter` adapts into where find(parameter name) says it lies; a null
// from find skips that weight.
template <typename Find>
void merge_adapted(const LoraAdapter& adapter, const Find& find) {
  for (const LoraLinear& l : adapter.linears()) {
    if (float* w = find(l.name + ".weight")) merge_linear(l, w);
  }
  for (const ExpertLora& l : adapter.experts()) {
    const int64_t e = l.n_experts, h = l.hidden, im = l.inter;
    if (l.gate_up.rank > 0) {
      if (float* w = find(l.name + ".gate_proj")) {
        merge_experts(w, l.gate_up, 0, e, h, im, l.scaling);
      }
      if (float* w = find(l.name + ".up_proj"))
        merge_experts(w, l.gate_up, im, e, h, im, l.scaling);
    }
    if (l.down.rank > 0) {
      if (float* w = find(l.name + ".down_proj")) merge_experts(w, l.down, 0, e, im, h, l.scaling);
    }
  }
}

}  // namespace

void merge_lora(const LoraAdapter& adapter, std::vector<ParamGroup>& groups) {
  merge_adapted(adapter, [&](const std::string& name) -> float* {
    for (ParamGroup& g : groups) {
      if (const ParamView* v = g.find(name)) return g.params() + v->offset;
    }
    fail("LoRA merge: the model has no ", name);
  });
}

void merge_lora_into(const LoraAdapter& adapter, ParamGroup& group,
                     const std::vector<std::string>& params) {
  merge_adapted(adapter, [&](const std::string& name) -> float* {
    if (std::find(params.begin(), params.end(), name) == params.end()) return nullptr;
    const ParamView* v = group.find(name);
    TITAN_CHECK(v != nullptr, "LoRA merge: group ", group.name(), " has no ", name);
    return group.params() + v->offset;
  });
}

void merge_peft_adapter(const std::string& dir, const ModelArgs& args,
                        std::vector<ParamGroup>& groups) {
  LoraAdapter adapter(args, read_peft_adapter_config(dir));
  load_peft_adapter(dir, adapter);
  merge_lora(adapter, groups);
}

}  // namespace titan
