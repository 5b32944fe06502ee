// Each subcommand registers its flags on the CLI11 app and returns the action to run after parsing.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>

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

// --threads N (default: physical cores), applied before the action runs.
void add_threads_option(CLI::App& command, int& threads);

}  // namespace titan::cli
