// Writing a complete Hugging Face model folder -- weights (sharded by size), config.json,
// generation_config.json and the tokenizer files of the folder the model came from -- that
// AutoModelForCausalLM.from_pretrained loads as is. The folder appears whole or not at all: it is
// written as a hidden sibling (.NAME.tmp-PID-N) and renamed into place once every file is
// complete and synced.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "titan/core/dtype.h"
#include "titan/io/safetensors_writer.h"
#include "titan/models/model_args.h"
#include "titan/nn/param_group.h"

namespace titan {

class CausalLM;

struct HfExportOptions {
  DType dtype = DType::bf16;  // export_dtype: every weight is stored as this (f32, bf16, f16)
  uint64_t max_shard_bytes = 5'000'000'000;  // HF's default "5GB"
  // A model folder whose tokenizer files and generation_config.json are copied; "" for none
  // (generation_config.json is then made from the model's token ids).
  std::string source_dir;
  // An existing destination is refused unless it is an empty folder, or `overwrite` is set and it
  // is a model folder titan wrote (its titan.json marker lists every file in it: io/atomic_dir.h),
  // which is then replaced as a whole. A destination that is source_dir, or inside it, or holds
  // it, is always refused.
  bool overwrite = false;
  // The training job's resolved config, written beside the weights as job_config.toml (the run's
  // record: what made this model); "" writes none.
  std::string job_config_toml;
};

// A stretch of the export's reads that falls in one parameter group: the writer reads the HF
// tensors file by file, each file's in name order (io/safetensors_writer.h), so a group's tensors
// are read in one stretch or a few (a [norm, lm_head] unit: lm_head first, the norm last).
struct ExportRun {
  size_t group = 0;                 // in model_param_specs(args) order
  std::vector<std::string> params;  // the group's parameters read in it
};

// The runs export_hf_folder reads a model of `args` in (options: its dtype and shard size), in
// order. Every rank of a sharded model walks them to take part in each run's gather.
std::vector<ExportRun> hf_export_runs(const ModelArgs& args, const HfExportOptions& options);

// The file a run's resolved config is saved as (in job.dump_folder, every checkpoint, the export).
inline constexpr const char* kJobConfigFile = "job_config.toml";

// torchtitan's export_dtype names (float32, bfloat16, float16) and the short ones (fp32, bf16,
// fp16); anything else is a titan::Error listing them.
DType parse_export_dtype(std::string_view name);

// The files copied from HfExportOptions::source_dir when present there.
const std::vector<std::string>& hf_tokenizer_files();

// What a model folder holds besides its weights, written into the existing folder `dir`:
// config.json (weights described as `dtype`), generation_config.json (source_dir's, else made from
// the model's token ids) and source_dir's tokenizer files ("" for none). Training checkpoints carry
// them too, so that a step-N folder describes its model and tokenizer.
void write_hf_metadata(const std::string& dir, const ModelArgs& args, DType dtype,
                       const std::string& source_dir);

// The folder `dir` from tensors under HF keys (float tensors of any float dtype, converted while
// written). The names and shapes must be exactly hf_keys(args).
void export_hf_folder(const std::string& dir, const ModelArgs& args,
                      const std::vector<SafetensorsTensor>& tensors,
                      const HfExportOptions& options);
// Parameters laid out by model_param_specs(args). `before_run`, when set, is called before each
// run's tensors are read (hf_export_runs), once the reads before it are done: an export from
// shards brings the run's parameters whole into `groups` there, one run at a time.
void export_hf_folder(const std::string& dir, const ModelArgs& args,
                      const std::vector<ParamGroup>& groups, const HfExportOptions& options,
                      const std::function<void(const ExportRun&)>& before_run = {});
void export_hf_folder(const std::string& dir, const CausalLM& model,
                      const HfExportOptions& options);

struct HfConvertOptions {
  std::optional<DType> dtype;  // nullopt: the source's, which must then be one for all tensors
  uint64_t max_shard_bytes = 5'000'000'000;
  bool overwrite = false;
  bool allow_nonfinite = false;  // convert weights holding NaN or Inf (refused otherwise)
};

struct HfConvertResult {
  ModelArgs args;
  DType dtype = DType::bf16;
  size_t tensors = 0;
  uint64_t data_bytes = 0;
};

// Re-exports the model folder `src` as `dst` tensor by tensor, straight from the mapped source
// files (no model, no fp32 copy, so any size of Qwen3 or Qwen3-MoE converts): validated like a
// load, converted to the chosen dtype, re-sharded, with config.json rewritten for that dtype and
// the tokenizer files copied. A tied lm_head.weight in the source is dropped. `dst` must lie
// apart from `src` (not the same folder, not inside it, not holding it).
HfConvertResult convert_hf_folder(const std::string& src, const std::string& dst,
                                  const HfConvertOptions& options);

}  // namespace titan
