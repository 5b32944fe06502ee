#include "titan/models/hf_export.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>

#include "titan/core/error.h"
#include "titan/io/atomic_dir.h"
#include "titan/io/atomic_file.h"
#include "titan/io/json_util.h"
#include "titan/io/safetensors.h"
#include "titan/models/causal_lm.h"
#include "titan/models/hf_checkpoint.h"
#include "titan/models/hf_config.h"
#include "titan/models/nonfinite_weights.h"
#include "titan/models/state_dict_adapter.h"
#include "titan/nn/host_params.h"

namespace titan {
namespace fs = std::filesystem;
namespace {

std::string read_whole_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  TITAN_CHECK(in.good(), path.string(), ": cannot open for reading");
  std::string content((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  TITAN_CHECK(!in.bad(), path.string(), ": read failed");
  return content;
}

// The tensors must be the model's HF state dict: a config.json beside weights it does not
// describe would be a folder Transformers refuses or, worse, loads wrongly.
void check_state_dict(const std::string& dir, const ModelArgs& args,
                      const std::vector<SafetensorsTensor>& tensors) {
  const std::vector<HfKey> keys = hf_keys(args);
  TITAN_CHECK(keys.size() == tensors.size(), dir, ": ", tensors.size(),
              " tensors given, but the model has ", keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    const Tensor& t = tensors[i].tensor;
    TITAN_CHECK(tensors[i].name == keys[i].key, dir, ": tensor ", json_quote(tensors[i].name),
                " given where the model has ", json_quote(keys[i].key));
    TITAN_CHECK(t.shape() == keys[i].shape, dir, ": tensor ", json_quote(keys[i].key),
                " has shape ", shape_str(t.shape()), ", the model's is ", shape_str(keys[i].shape));
  }
}

// generation_config.json and the tokenizer files from `source`, synced into `staging`.
void copy_source_files(const std::string& source, const ModelArgs& args,
                       const std::string& staging) {
  const fs::path from(source), to(staging);
  const fs::path generation = from / "generation_config.json";
  if (!source.empty() && fs::is_regular_file(generation)) {
    read_hf_generation_config(generation.string());  // refuse a broken one now, not in HF later
    write_file_atomic((to / "generation_config.json").string(), read_whole_file(generation));
  } else {
    write_hf_generation_config((to / "generation_config.json").string(),
                               default_generation_config(args));
  }
  if (source.empty()) return;
  for (const std::string& name : hf_tokenizer_files()) {
    if (fs::is_regular_file(from / name)) {
      write_file_atomic((to / name).string(), read_whole_file(from / name));
    }
  }
}

SafetensorsWriteOptions write_options(const HfExportOptions& options) {
  SafetensorsWriteOptions write;
  write.float_dtype = options.dtype;
  write.max_shard_bytes = options.max_shard_bytes;
  return write;
}

// Per HF key of hf_keys(args) (the state dict's order), its group and parameter; and the runs
// the writer reads them in.
struct KeyPlace {
  size_t group;
  std::string param;
};

std::vector<KeyPlace> key_places(const ModelArgs& args) {
  std::vector<KeyPlace> places;
  const std::vector<ParamGroupSpec> specs = model_param_specs(args);
  for (size_t g = 0; g < specs.size(); ++g) {
    for (const ParamSpec& param : specs[g].params) {
      for (size_t k = hf_keys_for(param).size(); k > 0; --k) places.push_back({g, param.name});
    }
  }
  return places;
}

std::vector<ExportRun> runs_of(const std::vector<KeyPlace>& places,
                               const std::vector<size_t>& read_order) {
  std::vector<ExportRun> runs;
  for (const size_t i : read_order) {
    const KeyPlace& at = places[i];
    if (runs.empty() || runs.back().group != at.group) runs.push_back({at.group, {}});
    std::vector<std::string>& params = runs.back().params;
    if (std::find(params.begin(), params.end(), at.param) == params.end()) {
      params.push_back(at.param);
    }
  }
  return runs;
}

}  // namespace

std::vector<ExportRun> hf_export_runs(const ModelArgs& args, const HfExportOptions& options) {
  std::vector<SafetensorsTensor> tensors;  // names and shapes only: the read order needs no data
  for (const HfKey& key : hf_keys(args)) {
    tensors.push_back({key.key, Tensor::view(nullptr, key.shape, DType::f32)});
  }
  return runs_of(key_places(args), safetensors_read_order(tensors, write_options(options)));
}

DType parse_export_dtype(std::string_view name) {
  if (name == "float32" || name == "fp32") return DType::f32;
  if (name == "bfloat16" || name == "bf16") return DType::bf16;
  if (name == "float16" || name == "fp16") return DType::f16;
  fail("export dtype ", json_quote(name),
       " is not one of float32, bfloat16, float16 (or fp32, bf16, fp16)");
}

const std::vector<std::string>& hf_tokenizer_files() {
  static const std::vector<std::string> names = {"tokenizer.json",
                                                 "tokenizer_config.json",
                                                 "special_tokens_map.json",
                                                 "added_tokens.json",
                                                 "vocab.json",
                                                 "merges.txt",
                                                 "chat_template.jinja",
                                                 "chat_template.json"};
  return names;
}

void write_hf_metadata(const std::string& dir, const ModelArgs& args, DType dtype,
                       const std::string& source_dir) {
  write_hf_config((fs::path(dir) / "config.json").string(), args, dtype);
  copy_source_files(source_dir, args, dir);
}

namespace {

void export_tensors(const std::string& dir, const ModelArgs& args,
                    const std::vector<SafetensorsTensor>& tensors, const HfExportOptions& options,
                    std::function<void(size_t)> before_read, bool in_device_memory) {
  validate_model_args(args, dir);
  check_state_dict(dir, args, tensors);
  TITAN_CHECK(
      options.dtype == DType::f32 || options.dtype == DType::bf16 || options.dtype == DType::f16,
      dir, ": weights cannot be exported as ", dtype_name(options.dtype));
  TITAN_CHECK(options.source_dir.empty() || fs::is_directory(options.source_dir),
              options.source_dir, ": the source model folder does not exist");
  check_destination_apart(dir, options.source_dir, "the source model folder");
  AtomicDir out(dir, "model", options.overwrite);
  SafetensorsWriteOptions write = write_options(options);
  write.before_read = std::move(before_read);
  if (in_device_memory) read_through_backend(write);
  int64_t total_bytes = 0;
  for (const SafetensorsTensor& t : tensors) {
    total_bytes += t.tensor.numel() * static_cast<int64_t>(dtype_size(options.dtype));
  }
  Progress progress("exporting " + dir, total_bytes, ProgressUnit::bytes);
  write.progress = &progress;
  write_safetensors_checkpoint(out.staging(), tensors, write);
  write_hf_metadata(out.staging(), args, options.dtype, options.source_dir);
  if (!options.job_config_toml.empty()) {
    write_file_atomic((fs::path(out.staging()) / kJobConfigFile).string(), options.job_config_toml);
  }
  out.commit();
}

}  // namespace

void export_hf_folder(const std::string& dir, const ModelArgs& args,
                      const std::vector<SafetensorsTensor>& tensors,
                      const HfExportOptions& options) {
  export_tensors(dir, args, tensors, options, {}, /*in_device_memory=*/false);
}

void export_hf_folder(const std::string& dir, const ModelArgs& args,
                      const std::vector<ParamGroup>& groups, const HfExportOptions& options,
                      const std::function<void(const ExportRun&)>& before_run) {
  // A device's groups (a device run's own) are read through the backend, a tensor at a time.
  const bool on_device = in_device_memory(groups);
  if (!before_run) {
    export_tensors(dir, args, hf_state_dict(args, groups), options, {}, on_device);
    return;
  }
  // The run each tensor starts, if any: the reads' order is the runs' (hf_export_runs).
  const std::vector<SafetensorsTensor> tensors = hf_state_dict(args, groups);
  const std::vector<KeyPlace> places = key_places(args);
  const std::vector<size_t> order = safetensors_read_order(tensors, write_options(options));
  const std::vector<ExportRun> runs = runs_of(places, order);
  std::vector<int64_t> run_starting(tensors.size(), -1);
  size_t run = 0;
  for (size_t at = 0; at < order.size(); ++at) {
    if (at == 0 || places[order[at]].group != places[order[at - 1]].group) {
      run_starting[order[at]] = static_cast<int64_t>(run++);
    }
  }
  export_tensors(
      dir, args, tensors, options,
      [&](size_t i) {
        if (run_starting[i] >= 0) before_run(runs[static_cast<size_t>(run_starting[i])]);
      },
      on_device);
}

void export_hf_folder(const std::string& dir, const CausalLM& model,
                      const HfExportOptions& options) {
  export_hf_folder(dir, model.args(), model.param_groups(), options);
}

HfConvertResult convert_hf_folder(const std::string& src, const std::string& dst,
                                  const HfConvertOptions& options) {
  const std::string config = (fs::path(src) / "config.json").string();
  TITAN_CHECK(fs::is_directory(src), src, ": not a model folder");
  check_destination_apart(dst, src, "the source model folder");
  HfConvertResult result;
  result.args = read_hf_config(config);
  const SafetensorsCheckpoint checkpoint = SafetensorsCheckpoint::open(src);
  const std::vector<HfCheckpointTensor> matched =
      match_hf_checkpoint(result.args, checkpoint, config);

  std::set<DType> source_dtypes;
  std::vector<SafetensorsTensor> tensors;
  tensors.reserve(matched.size());
  for (const SafetensorsFile& file : checkpoint.files()) file.prefetch();
  NonfiniteScan scan;
  for (const HfCheckpointTensor& t : matched) {
    source_dtypes.insert(*t.entry->dtype);
    scan.add(t.entry->file, t.key.key, t.entry->data, *t.entry->dtype,
             static_cast<size_t>(t.entry->numel()));
    // The writer only reads through this view; the mapping itself is read-only.
    tensors.push_back(
        {t.key.key, Tensor::view(const_cast<void*>(t.entry->data), t.key.shape, *t.entry->dtype)});
  }
  if (options.dtype) {
    result.dtype = *options.dtype;
  } else {
    TITAN_CHECK(source_dtypes.size() == 1, src,
                ": the tensors have more than one dtype; choose the export dtype");
    result.dtype = *source_dtypes.begin();
  }
  scan.check(options.allow_nonfinite);
  result.tensors = tensors.size();
  for (const SafetensorsTensor& t : tensors) {
    result.data_bytes += static_cast<uint64_t>(t.tensor.numel()) * dtype_size(result.dtype);
  }
  HfExportOptions out;
  out.dtype = result.dtype;
  out.max_shard_bytes = options.max_shard_bytes;
  out.source_dir = src;
  out.overwrite = options.overwrite;
  // The record of the run that made the model travels with it.
  if (const fs::path job = fs::path(src) / kJobConfigFile; fs::is_regular_file(job)) {
    out.job_config_toml = read_whole_file(job);
  }
  export_hf_folder(dst, result.args, tensors, out);
  return result;
}

}  // namespace titan
