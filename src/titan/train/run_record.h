// A run's record in job.dump_folder, its checkpoints and its export: the resolved config
// (job_config.toml), the metrics JSONL's place, and the size of what was saved for the log lines.
#pragma once

#include <cstdint>
#include <string>

#include "titan/models/model_args.h"
#include "titan/train/job_config.h"

namespace titan {

// metrics.save_jsonl: a relative path lies under job.dump_folder; "" for none.
std::string metrics_jsonl_path(const JobConfig& config);

// metrics.enable_tensorboard's folder for this run, as torchtitan names it:
// job.dump_folder/metrics.save_tb_folder/<YYYYMMDD-HHMM, local time now> (an absolute
// save_tb_folder as is); "" when TensorBoard is off.
std::string tensorboard_run_dir(const JobConfig& config);

// The resolved config as `dir`/job_config.toml (models/hf_export.h's kJobConfigFile), atomically.
void write_job_config_record(const std::string& dir, const JobConfig& config);

// What a training checkpoint's folder `dir` carries besides its tensors: job_config.toml, and the
// model's config.json, generation_config.json and the tokenizer files of `tokenizer_dir`, so that
// a step-N folder is a model for titan info, eval, generate and convert.
void write_checkpoint_record(const std::string& dir, const JobConfig& config, const ModelArgs& args,
                             const std::string& tokenizer_dir);

// "SIZE, S.SS s" for a folder just saved since `start_seconds` (core/clock.h's now_seconds()).
std::string saved_folder_summary(const std::string& dir, double start_seconds);

}  // namespace titan
