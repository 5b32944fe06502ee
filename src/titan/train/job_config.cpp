#include "titan/train/job_config.h"

#include <toml++/toml.h>
#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <variant>

#include "titan/backend/backend.h"
#include "titan/core/error.h"
#include "titan/core/suggest.h"
#include "titan/models/lora.h"
#include "titan/models/registry.h"
#include "titan/train/job_config_torchtitan.h"

namespace titan {
namespace {

using FieldTarget = std::variant<int64_t*, double*, bool*, std::string*>;

struct Field {
  const char* section;
  const char* key;
  FieldTarget target;
};

// The one table of every configurable field; [overrides] is the only free-form section.
std::vector<Field> fields(JobConfig& c) {
  return {
      {"job", "dump_folder", &c.job.dump_folder},
      {"job", "description", &c.job.description},
      {"model", "name", &c.model.name},
      {"model", "flavor", &c.model.flavor},
      {"model", "hf_assets_path", &c.model.hf_assets_path},
      {"model", "attn_backend", &c.model.attn_backend},
      {"model", "output_router_logits", &c.model.output_router_logits},
      {"model", "router_aux_loss_scope", &c.model.router_aux_loss_scope},
      {"training", "local_batch_size", &c.training.local_batch_size},
      {"training", "global_batch_size", &c.training.global_batch_size},
      {"training", "seq_len", &c.training.seq_len},
      {"training", "steps", &c.training.steps},
      {"training", "max_norm", &c.training.max_norm},
      {"training", "dataset", &c.training.dataset},
      {"training", "dataset_path", &c.training.dataset_path},
      {"training", "truncate_long_conversations", &c.training.truncate_long_conversations},
      {"training", "dataset_packing", &c.training.dataset_packing},
      {"training", "seed", &c.training.seed},
      {"training", "deterministic", &c.training.deterministic},
      {"training", "mixed_precision_param", &c.training.mixed_precision_param},
      {"training", "mixed_precision_reduce", &c.training.mixed_precision_reduce},
      {"training", "skip_nonfinite_steps", &c.training.skip_nonfinite_steps},
      {"training", "allow_tf32", &c.training.allow_tf32},
      {"training", "device", &c.training.device},
      {"optimizer", "name", &c.optimizer.name},
      {"optimizer", "lr", &c.optimizer.lr},
      {"optimizer", "beta1", &c.optimizer.beta1},
      {"optimizer", "beta2", &c.optimizer.beta2},
      {"optimizer", "eps", &c.optimizer.eps},
      {"optimizer", "weight_decay", &c.optimizer.weight_decay},
      {"lr_scheduler", "warmup_steps", &c.lr_scheduler.warmup_steps},
      {"lr_scheduler", "decay_ratio", &c.lr_scheduler.decay_ratio},
      {"lr_scheduler", "decay_type", &c.lr_scheduler.decay_type},
      {"lr_scheduler", "min_lr_factor", &c.lr_scheduler.min_lr_factor},
      {"parallelism", "data_parallel_replicate_degree",
       &c.parallelism.data_parallel_replicate_degree},
      {"parallelism", "data_parallel_shard_degree", &c.parallelism.data_parallel_shard_degree},
      {"parallelism", "tensor_parallel_degree", &c.parallelism.tensor_parallel_degree},
      {"parallelism", "enable_sequence_parallel", &c.parallelism.enable_sequence_parallel},
      {"parallelism", "pipeline_parallel_degree", &c.parallelism.pipeline_parallel_degree},
      {"parallelism", "context_parallel_degree", &c.parallelism.context_parallel_degree},
      {"parallelism", "expert_parallel_degree", &c.parallelism.expert_parallel_degree},
      {"parallelism", "fsdp_reshard_after_forward", &c.parallelism.fsdp_reshard_after_forward},
      {"checkpoint", "enable", &c.checkpoint.enable},
      {"checkpoint", "folder", &c.checkpoint.folder},
      {"checkpoint", "interval", &c.checkpoint.interval},
      {"checkpoint", "keep_latest_k", &c.checkpoint.keep_latest_k},
      {"checkpoint", "initial_load_path", &c.checkpoint.initial_load_path},
      {"checkpoint", "initial_load_model_only", &c.checkpoint.initial_load_model_only},
      {"checkpoint", "initial_load_in_hf", &c.checkpoint.initial_load_in_hf},
      {"checkpoint", "last_save_model_only", &c.checkpoint.last_save_model_only},
      {"checkpoint", "last_save_in_hf", &c.checkpoint.last_save_in_hf},
      {"checkpoint", "export_dtype", &c.checkpoint.export_dtype},
      {"checkpoint", "load_step", &c.checkpoint.load_step},
      {"checkpoint", "allow_fresh_start", &c.checkpoint.allow_fresh_start},
      {"checkpoint", "allow_nonfinite_weights", &c.checkpoint.allow_nonfinite_weights},
      {"checkpoint", "async_mode", &c.checkpoint.async_mode},
      {"comm", "init_timeout_seconds", &c.comm.init_timeout_seconds},
      {"comm", "train_timeout_seconds", &c.comm.train_timeout_seconds},
      {"comm", "heartbeat_timeout_seconds", &c.comm.heartbeat_timeout_seconds},
      {"activation_checkpoint", "mode", &c.activation_checkpoint.mode},
      {"activation_checkpoint", "selective_ac_option",
       &c.activation_checkpoint.selective_ac_option},
      {"metrics", "log_freq", &c.metrics.log_freq},
      {"metrics", "save_jsonl", &c.metrics.save_jsonl},
      {"metrics", "enable_tensorboard", &c.metrics.enable_tensorboard},
      {"metrics", "save_tb_folder", &c.metrics.save_tb_folder},
      {"metrics", "peak_tflops", &c.metrics.peak_tflops},
      {"profiling", "enable_profiling", &c.profiling.enable_profiling},
      {"profiling", "save_traces_folder", &c.profiling.save_traces_folder},
      {"profiling", "profile_freq", &c.profiling.profile_freq},
      {"profiling", "profiler_active", &c.profiling.profiler_active},
      {"validation", "enable", &c.validation.enable},
      {"validation", "dataset", &c.validation.dataset},
      {"validation", "dataset_path", &c.validation.dataset_path},
      {"validation", "freq", &c.validation.freq},
      {"validation", "steps", &c.validation.steps},
      {"experimental", "custom_import", &c.experimental.custom_import},
      {"lora", "rank", &c.lora.rank},
      {"lora", "alpha", &c.lora.alpha},
      {"lora", "dropout", &c.lora.dropout},
      {"lora", "target_modules", &c.lora.target_modules},
      {"lora", "merge_on_export", &c.lora.merge_on_export},
      {"lora", "initial_adapter", &c.lora.initial_adapter},
      {"lora", "base_dtype", &c.lora.base_dtype},
  };
}

std::vector<std::string> section_names(JobConfig& c) {
  std::vector<std::string> names;
  for (const Field& f : fields(c)) {
    if (names.empty() || names.back() != f.section) names.emplace_back(f.section);
  }
  names.emplace_back("overrides");
  return names;
}

// The field for section.key (torchtitan's older [training] place for the data-parallel keys and
// its [debug] place for seed and deterministic included), or nullopt.
std::optional<Field> lookup_field(JobConfig& c, const std::string& section,
                                  const std::string& key) {
  for (const Field& f : fields(c)) {
    if (f.section == section && f.key == key) return f;
  }
  // torchtitan kept the data-parallel keys in [training] before it had a [parallelism] section.
  static const char* const moved_to_parallelism[] = {
      "data_parallel_replicate_degree", "data_parallel_shard_degree", "tensor_parallel_degree",
      "fsdp_reshard_after_forward"};
  for (const char* moved : moved_to_parallelism) {
    if (section != "training" || key != moved) continue;
    const std::string old_name = section + "." + key;
    if (std::find(c.renamed_keys.begin(), c.renamed_keys.end(), old_name) == c.renamed_keys.end()) {
      c.renamed_keys.push_back(old_name);
    }
    return lookup_field(c, "parallelism", key);
  }
  // Newer torchtitan keeps them in [debug]; titan in [training], as torchtitan did before.
  if (section == "debug" && (key == "seed" || key == "deterministic")) {
    return lookup_field(c, "training", key);
  }
  return std::nullopt;
}

// Why section.key is unknown, with the closest valid name.
std::string unknown_key_message(JobConfig& c, const std::string& section, const std::string& key) {
  const std::vector<std::string> sections = section_names(c);
  // Candidates: titan's keys of the section and torchtitan's it accepts without effect.
  std::vector<std::string> keys = torchtitan_inert_keys_in(section);
  if (keys.empty() && std::find(sections.begin(), sections.end(), section) == sections.end()) {
    return "unknown section [" + section + "]; did you mean [" + closest_name(section, sections) +
           "]?";
  }
  for (const Field& f : fields(c)) {
    if (f.section == section) keys.emplace_back(f.key);
  }
  return "unknown key '" + key + "' in [" + section + "]; did you mean '" +
         closest_name(key, keys) + "'?";
}

// A torchtitan key titan accepts without effect: recorded for the start-up line. True if it is one.
bool accept_inert(JobConfig& c, const std::string& dotted) {
  if (torchtitan_inert_key_reason(dotted) == nullptr) return false;
  if (std::find(c.inert_keys.begin(), c.inert_keys.end(), dotted) == c.inert_keys.end()) {
    c.inert_keys.push_back(dotted);
  }
  return true;
}

const char* type_name(const FieldTarget& t) {
  switch (t.index()) {
    case 0:
      return "an integer";
    case 1:
      return "a number";
    case 2:
      return "true or false";
    default:
      return "a string";
  }
}

void set_from_text(const Field& f, const std::string& text, const std::string& where) {
  const auto bad = [&]() {
    fail(where, ": ", f.section, ".", f.key, " must be ", type_name(f.target), ", got '", text,
         "'");
  };
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  if (auto* i = std::get_if<int64_t*>(&f.target)) {
    const auto [ptr, ec] = std::from_chars(begin, end, **i);
    if (ec != std::errc() || ptr != end) bad();
  } else if (auto* d = std::get_if<double*>(&f.target)) {
    const auto [ptr, ec] = std::from_chars(begin, end, **d);
    if (ec != std::errc() || ptr != end) bad();
  } else if (auto* b = std::get_if<bool*>(&f.target)) {
    if (text == "true" || text == "1") {
      **b = true;
    } else if (text == "false" || text == "0") {
      **b = false;
    } else {
      bad();
    }
  } else {
    *std::get<std::string*>(f.target) = text;
  }
}

void set_from_toml(const Field& f, const toml::node& node, const std::string& where) {
  bool ok = false;
  if (auto* i = std::get_if<int64_t*>(&f.target)) {
    if (auto v = node.value_exact<int64_t>()) **i = *v, ok = true;
  } else if (auto* d = std::get_if<double*>(&f.target)) {
    if (auto v = node.value<double>()) **d = *v, ok = true;  // integers are numbers too
  } else if (auto* b = std::get_if<bool*>(&f.target)) {
    if (auto v = node.value_exact<bool>()) **b = *v, ok = true;
  } else if (auto v = node.value_exact<std::string>()) {
    *std::get<std::string*>(f.target) = *v, ok = true;
  }
  TITAN_CHECK(ok, where, ": ", f.section, ".", f.key, " must be ", type_name(f.target));
}

void mark_set(JobConfig& c, const Field& f) {
  const std::string name = std::string(f.section) + "." + f.key;
  if (std::find(c.set_keys.begin(), c.set_keys.end(), name) == c.set_keys.end()) {
    c.set_keys.push_back(name);
  }
}

void set_override(JobConfig& c, const std::string& pattern, const std::string& kernel) {
  for (auto& [p, k] : c.overrides) {
    if (p == pattern) {
      k = kernel;
      return;
    }
  }
  c.overrides.emplace_back(pattern, kernel);
}

// The shortest decimal that reads back as the same double (0.9, not 0.90000000000000002), in a
// form TOML reads as a float.
std::string toml_float(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  std::string text(buf, end);
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

void check_one_of(const std::string& value, const std::vector<std::string>& allowed,
                  const char* field) {
  TITAN_CHECK(std::find(allowed.begin(), allowed.end(), value) != allowed.end(), field, " '", value,
              "' is not one of ", join_names(allowed));
}

}  // namespace

JobConfig job_config_preset(const std::string& name) {
  JobConfig c;
  // The small models end with a model folder, which `titan generate` and `eval` read.
  if (name == "tiny" || name == "tiny_moe" || name == "debugmodel" || name == "debugmodel_moe") {
    c.model.flavor = name;
    c.checkpoint.last_save_in_hf = true;
    return c;
  }
  if (name == "hf") {
    c.model.flavor = "hf";
    return c;
  }
  // Official dims: short runs at moderate sequence length, as torchtitan's qwen3 presets.
  const std::vector<std::pair<std::string, std::string>> sized = {
      {"qwen3_0.6b", "0.6B"},       {"qwen3_1.7b", "1.7B"},
      {"qwen3_4b", "4B"},           {"qwen3_8b", "8B"},
      {"qwen3_14b", "14B"},         {"qwen3_32b", "32B"},
      {"qwen3_30b_a3b", "30B-A3B"}, {"qwen3_235b_a22b", "235B-A22B"}};
  for (const auto& [preset, flavor] : sized) {
    if (preset != name) continue;
    c.model.flavor = flavor;
    c.training.local_batch_size = 1;
    c.training.seq_len = 2048;
    c.training.steps = 10;
    c.lr_scheduler.warmup_steps = 2;
    c.optimizer.lr = 3e-4;
    return c;
  }
  const std::vector<std::string> names = job_config_preset_names();
  fail("unknown preset '", name, "'; did you mean '", closest_name(name, names),
       "'? (presets: ", join_names(names), ")");
}

std::vector<std::string> job_config_preset_names() {
  return {"tiny",       "tiny_moe",      "debugmodel",     "debugmodel_moe", "hf",
          "qwen3_0.6b", "qwen3_1.7b",    "qwen3_4b",       "qwen3_8b",       "qwen3_14b",
          "qwen3_32b",  "qwen3_30b_a3b", "qwen3_235b_a22b"};
}

void job_config_apply_toml(JobConfig& config, const std::string& path) {
  // toml++ reads a folder or an unreadable file as an empty document: the default run would start.
  std::error_code ec;
  TITAN_CHECK(!std::filesystem::is_directory(path, ec), path,
              ": is a folder, not a TOML config file");
  TITAN_CHECK(std::ifstream(path).good(), path, ": cannot read the config file: ",
              std::filesystem::exists(path, ec) ? std::strerror(errno) : "no such file");
  toml::table root;
  try {
    root = toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    fail(path, ":", where.line, ":", where.column, ": ", e.description());
  }
  std::vector<std::string> unknown;
  // Nested tables below a section ([quantize.linear.float8]) hold only torchtitan keys titan
  // accepts without effect, or unknown ones.
  const auto nested = [&](const auto& self, const std::string& prefix, const toml::table& table,
                          const std::string& section) -> void {
    for (const auto& [key_node, value] : table) {
      const std::string dotted = prefix + "." + std::string(key_node.str());
      if (const toml::table* inner = value.as_table()) {
        self(self, dotted, *inner, section);
      } else if (!accept_inert(config, dotted)) {
        unknown.push_back("unknown key '" + dotted.substr(section.size() + 1) + "' in [" + section +
                          "]");
      }
    }
  };
  for (const auto& [section_key, section_node] : root) {
    const std::string section(section_key.str());
    const toml::table* table = section_node.as_table();
    TITAN_CHECK(table != nullptr, path, ": '", section, "' must be a [section]");
    for (const auto& [key_node, value] : *table) {
      const std::string key(key_node.str());
      const std::string where =
          path + ":" + std::to_string(value.source().begin.line) + ": " + section + "." + key;
      if (section == "overrides") {
        auto kernel = value.value_exact<std::string>();
        TITAN_CHECK(kernel.has_value(), where,
                    ": an override maps a module pattern to a kernel name (a string)");
        set_override(config, key, *kernel);
        continue;
      }
      if (const std::optional<Field> f = lookup_field(config, section, key)) {
        set_from_toml(*f, value, where);
        mark_set(config, *f);
      } else if (const toml::table* inner = value.as_table()) {
        nested(nested, section + "." + key, *inner, section);
      } else if (!accept_inert(config, section + "." + key)) {
        unknown.push_back(unknown_key_message(config, section, key));
      }
    }
  }
  // Every unknown name of the file at once, not one per run.
  if (unknown.size() == 1) fail(path, ": ", unknown.front());
  if (!unknown.empty()) {
    std::string all;
    for (const std::string& u : unknown) all += (all.empty() ? "" : "; ") + u;
    fail(path, ": ", unknown.size(), " unknown keys: ", all);
  }
}

void job_config_apply_override(JobConfig& config, const std::string& flag) {
  std::string body = flag.rfind("--", 0) == 0 ? flag.substr(2) : flag;
  const size_t eq = body.find('=');
  const size_t dot = body.find('.');
  TITAN_CHECK(eq != std::string::npos && dot != std::string::npos && dot < eq, "'", flag,
              "': expected --section.key=value");
  const std::string section = body.substr(0, dot), key = body.substr(dot + 1, eq - dot - 1);
  const std::string value = body.substr(eq + 1);
  if (section == "overrides") {
    set_override(config, key, value);
    return;
  }
  const std::optional<Field> f = lookup_field(config, section, key);
  if (!f) {
    if (accept_inert(config, section + "." + key)) return;
    fail("'", flag, "': ", unknown_key_message(config, section, key));
  }
  set_from_text(*f, value, "'" + flag + "'");
  mark_set(config, *f);
}

void job_config_validate(const JobConfig& c) {
  const auto positive = [](int64_t v, const char* field) {
    TITAN_CHECK(v > 0, field, " must be positive, got ", v);
  };
  positive(c.training.local_batch_size, "training.local_batch_size");
  positive(c.training.seq_len, "training.seq_len");
  TITAN_CHECK(c.training.steps >= 0, "training.steps must not be negative");
  TITAN_CHECK(c.training.global_batch_size == -1 || c.training.global_batch_size > 0,
              "training.global_batch_size must be positive or -1");
  TITAN_CHECK(c.training.max_norm >= 0, "training.max_norm must not be negative (0 disables)");
  check_one_of(c.training.mixed_precision_param, {"float32", "bfloat16"},
               "training.mixed_precision_param");
  check_one_of(c.model.router_aux_loss_scope, {"global", "local"}, "model.router_aux_loss_scope");
  try {
    parse_device_name(c.training.device);
  } catch (const Error& e) {
    fail("training.device: ", e.what());
  }
  check_one_of(c.parallelism.fsdp_reshard_after_forward, {"default", "always", "never"},
               "parallelism.fsdp_reshard_after_forward");
  TITAN_CHECK(c.training.mixed_precision_reduce == "float32", "training.mixed_precision_reduce '",
              c.training.mixed_precision_reduce,
              "': gradients are reduced in float32, the only value torchtitan takes");
  TITAN_CHECK(model_family_by_name(c.model.name) != nullptr, "model.name '", c.model.name,
              "' is not one of ", known_model_names());
  check_one_of(c.optimizer.name, {"AdamW"}, "optimizer.name");
  TITAN_CHECK(c.optimizer.lr > 0, "optimizer.lr must be positive");
  TITAN_CHECK(c.optimizer.beta1 >= 0 && c.optimizer.beta1 < 1, "optimizer.beta1 must be in [0, 1)");
  TITAN_CHECK(c.optimizer.beta2 >= 0 && c.optimizer.beta2 < 1, "optimizer.beta2 must be in [0, 1)");
  TITAN_CHECK(c.optimizer.eps > 0, "optimizer.eps must be positive");
  TITAN_CHECK(c.optimizer.weight_decay >= 0, "optimizer.weight_decay must not be negative");
  TITAN_CHECK(c.lr_scheduler.warmup_steps >= 0, "lr_scheduler.warmup_steps must not be negative");
  TITAN_CHECK(c.lr_scheduler.decay_ratio == -1.0 ||
                  (c.lr_scheduler.decay_ratio >= 0 && c.lr_scheduler.decay_ratio <= 1),
              "lr_scheduler.decay_ratio must be in [0, 1] (or -1: decay after warmup)");
  check_one_of(c.lr_scheduler.decay_type, {"linear", "cosine", "sqrt", "none"},
               "lr_scheduler.decay_type");
  TITAN_CHECK(c.lr_scheduler.min_lr_factor >= 0 && c.lr_scheduler.min_lr_factor <= 1,
              "lr_scheduler.min_lr_factor must be in [0, 1]");
  positive(c.comm.init_timeout_seconds, "comm.init_timeout_seconds");
  positive(c.comm.train_timeout_seconds, "comm.train_timeout_seconds");
  positive(c.comm.heartbeat_timeout_seconds, "comm.heartbeat_timeout_seconds");
  check_one_of(c.activation_checkpoint.mode, {"none", "full", "selective"},
               "activation_checkpoint.mode");
  job_activation_checkpointing(c);  // a bad selective_ac_option under selective
  positive(c.metrics.log_freq, "metrics.log_freq");
  TITAN_CHECK(
      c.metrics.peak_tflops >= 0 && std::isfinite(c.metrics.peak_tflops),
      "metrics.peak_tflops must be a positive TFLOP/s figure, or 0 for the hardware's peak");
  if (c.profiling.enable_profiling) {
    positive(c.profiling.profile_freq, "profiling.profile_freq");
    TITAN_CHECK(
        c.profiling.profiler_active >= 1 && c.profiling.profiler_active <= c.profiling.profile_freq,
        "profiling.profiler_active ", c.profiling.profiler_active,
        " must be between 1 and profiling.profile_freq (", c.profiling.profile_freq,
        "): the steps recorded in each trace");
  }
  positive(c.checkpoint.interval, "checkpoint.interval");
  TITAN_CHECK(c.checkpoint.keep_latest_k >= 0, "checkpoint.keep_latest_k must not be negative");
  check_one_of(c.checkpoint.export_dtype, {"float32", "bfloat16", "float16"},
               "checkpoint.export_dtype");
  check_one_of(c.checkpoint.async_mode, {"disabled", "async", "async_with_pinned_mem"},
               "checkpoint.async_mode");
  if (c.validation.enable) {
    positive(c.validation.freq, "validation.freq");
    positive(c.validation.steps, "validation.steps");
  }
  for (int64_t degree :
       {c.parallelism.data_parallel_replicate_degree, c.parallelism.tensor_parallel_degree,
        c.parallelism.pipeline_parallel_degree, c.parallelism.context_parallel_degree,
        c.parallelism.expert_parallel_degree}) {
    TITAN_CHECK(
        degree >= 1,
        "parallelism degrees must be at least 1 (only data_parallel_shard_degree may be -1)");
  }
  TITAN_CHECK(c.lora.rank >= 0, "lora.rank ", c.lora.rank,
              " must not be negative (0 turns LoRA off)");
  if (c.lora.rank > 0) {
    TITAN_CHECK(c.lora.alpha > 0 && std::isfinite(c.lora.alpha), "lora.alpha ", c.lora.alpha,
                " must be a positive number");
    TITAN_CHECK(c.lora.dropout >= 0.0 && c.lora.dropout < 1.0, "lora.dropout ", c.lora.dropout,
                " must be at least 0 and below 1 (the probability of dropping an input)");
    parse_lora_targets(c.lora.target_modules, "lora.target_modules");
  }
  check_one_of(c.lora.base_dtype, {"float32", "bfloat16"}, "lora.base_dtype");
  if (c.lora.base_dtype == "bfloat16") {
    TITAN_CHECK(c.lora.rank > 0,
                "lora.base_dtype = \"bfloat16\" holds a LoRA run's frozen base in bf16: set "
                "lora.rank > 0 (without LoRA every weight trains and keeps its fp32 master)");
    TITAN_CHECK(c.training.mixed_precision_param == "bfloat16",
                "lora.base_dtype = \"bfloat16\" holds the frozen base as the bf16 copies bf16 "
                "matmuls read: set training.mixed_precision_param = \"bfloat16\" (fp32 compute "
                "reads fp32 weights)");
  }
  TITAN_CHECK(c.parallelism.data_parallel_shard_degree == -1 ||
                  c.parallelism.data_parallel_shard_degree >= 1,
              "parallelism.data_parallel_shard_degree must be -1 or at least 1");
}

ActivationCheckpointing job_activation_checkpointing(const JobConfig& config) {
  const std::string& mode = config.activation_checkpoint.mode;
  if (mode == "full") return ActivationCheckpointing::full();
  if (mode != "selective") return ActivationCheckpointing::none();
  const std::string& option = config.activation_checkpoint.selective_ac_option;
  if (option == "op") return ActivationCheckpointing::ops();
  int64_t every = 0;
  const char* end = option.data() + option.size();
  const auto [stop, ec] = std::from_chars(option.data(), end, every);
  TITAN_CHECK(!option.empty() && option[0] != '-' && option[0] != '+' && ec == std::errc() &&
                  stop == end && every > 0,
              "activation_checkpoint.selective_ac_option \"", option,
              "\" is not \"op\" or a positive layer count N (every N-th layer recomputed)");
  return ActivationCheckpointing::every_nth_layer(every);
}

bool job_config_key_set(const JobConfig& config, std::string_view key) {
  if (std::find(config.set_keys.begin(), config.set_keys.end(), key) == config.set_keys.end()) {
    return false;
  }
  JobConfig c = config, defaults;
  const std::vector<Field> set = fields(c), unset = fields(defaults);
  for (size_t i = 0; i < set.size(); ++i) {
    if (std::string(set[i].section) + "." + set[i].key != key) continue;
    return std::visit(
        [&](auto* value) { return *value != *std::get<decltype(value)>(unset[i].target); },
        set[i].target);
  }
  return true;
}

std::string job_config_to_toml(const JobConfig& config) {
  JobConfig c = config;
  std::ostringstream os;
  std::string section;
  for (const Field& f : fields(c)) {
    if (f.section != section) {
      os << (section.empty() ? "" : "\n") << "[" << f.section << "]\n";
      section = f.section;
    }
    os << f.key << " = ";
    if (auto* d = std::get_if<double*>(&f.target)) {
      os << toml_float(**d);
    } else if (auto* i = std::get_if<int64_t*>(&f.target)) {
      os << **i;
    } else if (auto* b = std::get_if<bool*>(&f.target)) {
      os << (**b ? "true" : "false");
    } else {
      os << toml::value<std::string>(*std::get<std::string*>(f.target));
    }
    os << "\n";
  }
  toml::table overrides;
  for (const auto& [pattern, kernel] : c.overrides) overrides.insert(pattern, kernel);
  os << "\n[overrides]\n" << overrides << "\n";
  return os.str();
}

}  // namespace titan
