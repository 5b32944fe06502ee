// The job config flags titan train and titan plan share (commands.h).
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "titan/core/suggest.h"
#include "titan/train/job_config.h"
#include "titan/train/job_resolve.h"

namespace titan::cli {

void add_job_config_options(CLI::App& command, JobConfigFlags& flags) {
  flags.preset = std::string(kDefaultPreset);
  command
      .add_option("--preset", flags.preset,
                  "built-in preset: " + join_names(job_config_preset_names()))
      ->capture_default_str();
  command.add_option("--config", flags.config_file, "TOML file applied on top of the preset");
  command.allow_extras();
}

JobConfig job_config_from_flags(const CLI::App& command, const JobConfigFlags& flags,
                                std::vector<std::string>& defaults_applied) {
  JobConfig config = job_config_preset(flags.preset);
  if (!flags.config_file.empty()) job_config_apply_toml(config, flags.config_file);
  for (const std::string& flag : command.remaining()) job_config_apply_override(config, flag);
  job_config_validate(config);
  for (std::string& line : resolve_job_defaults(config, flags.preset)) {
    defaults_applied.push_back(std::move(line));
  }
  return config;
}

}  // namespace titan::cli
