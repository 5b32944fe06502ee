#include "titan/train/run_record.h"

#include <cstdio>
#include <ctime>
#include <filesystem>

#include "titan/core/clock.h"
#include "titan/io/atomic_file.h"
#include "titan/io/byte_size.h"
#include "titan/models/hf_export.h"

namespace titan {

std::string metrics_jsonl_path(const JobConfig& c) {
  const std::string& path = c.metrics.save_jsonl;
  if (path.empty() || std::filesystem::path(path).is_absolute()) return path;
  return c.job.dump_folder + "/" + path;
}

std::string tensorboard_run_dir(const JobConfig& c) {
  if (!c.metrics.enable_tensorboard) return "";
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char stamp[32];
  std::strftime(stamp, sizeof stamp, "%Y%m%d-%H%M", &local);
  const std::filesystem::path folder(c.metrics.save_tb_folder);
  return ((folder.is_absolute() ? folder : c.job.dump_folder / folder) / stamp).string();
}

void write_job_config_record(const std::string& dir, const JobConfig& config) {
  write_file_atomic(dir + "/" + kJobConfigFile, job_config_to_toml(config));
}

void write_checkpoint_record(const std::string& dir, const JobConfig& config, const ModelArgs& args,
                             const std::string& tokenizer_dir) {
  write_job_config_record(dir, config);
  write_hf_metadata(dir, args, DType::f32, tokenizer_dir);
}

std::string saved_folder_summary(const std::string& dir, double start_seconds) {
  const double seconds = now_seconds() - start_seconds;
  uint64_t bytes = 0;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    if (entry.is_regular_file()) bytes += entry.file_size();
  }
  char text[32];
  std::snprintf(text, sizeof text, ", %.2f s", seconds);
  return format_byte_size(bytes) + text;
}

}  // namespace titan
