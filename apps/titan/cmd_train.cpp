#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "commands.h"
#include "titan/backend/cpu/threads.h"
#include "titan/core/error.h"
#include "titan/distributed/world.h"
#include "titan/train/job_config.h"
#include "titan/train/trainer.h"

namespace titan::cli {

Action add_train_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "train",
      "train a model (torchtitan-style config; any key as --section.key=value, e.g. "
      "--training.steps=50)");
  static JobConfigFlags config_flags;
  static bool print_config = false;
  static int threads;
  add_threads_option(*command, threads);
  const CLI::Option* threads_option = command->get_option("--threads");
  add_job_config_options(*command, config_flags);
  command->add_flag("--print-config", print_config, "print the resolved config and exit");
  return [command, threads_option] {
    // Ranks on one machine share its cores unless --threads says otherwise.
    const int local_ranks = world_info().local_size;
    set_thread_count(threads_option->count() > 0 ? threads : std::max(1, threads / local_ranks));
    std::vector<std::string> defaults_applied;
    const JobConfig config = job_config_from_flags(*command, config_flags, defaults_applied);
    if (print_config) {
      std::fputs(job_config_to_toml(config).c_str(), stdout);
      return 0;
    }
    for (const std::string& line : defaults_applied) std::printf("%s\n", line.c_str());
    Trainer trainer(config);
    trainer.run();
    return 0;
  };
}

}  // namespace titan::cli
