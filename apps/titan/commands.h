// Each subcommand registers its flags on the CLI11 app and returns the action to run after parsing.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <string>
#include <vector>

namespace titan {
struct JobConfig;
}

namespace titan::cli {

using Action = std::function<int()>;

Action add_info_command(CLI::App& app);
Action add_convert_command(CLI::App& app);
Action add_tokenize_command(CLI::App& app);
Action add_tokenizer_command(CLI::App& app);
Action add_train_command(CLI::App& app);
Action add_plan_command(CLI::App& app);
Action add_eval_command(CLI::App& app);
Action add_generate_command(CLI::App& app);
Action add_launch_command(CLI::App& app);
Action add_verify_kernels_command(CLI::App& app);

// --threads N (default: physical cores), applied before the action runs.
void add_threads_option(CLI::App& command, int& threads);

// The job config a command takes as titan train does: --preset, --config, and any
// --section.key=value left over (the command allows extras).
struct JobConfigFlags {
  std::string preset;  // kDefaultPreset unless --preset names another
  std::string config_file;
};
void add_job_config_options(CLI::App& command, JobConfigFlags& flags);
// The preset, the TOML file on top, then each override in order; validated; then the defaults
// that depend on its inputs (resolve_job_defaults, train/job_resolve.h: a Hugging Face folder
// fine-tuned), the lines saying what they applied appended to `defaults_applied`.
JobConfig job_config_from_flags(const CLI::App& command, const JobConfigFlags& flags,
                                std::vector<std::string>& defaults_applied);

}  // namespace titan::cli
