// The titan command line: one binary, one subcommand per job. Every error raised anywhere below
// arrives here and leaves as one line on stderr and exit status 1 (2 for a malformed command line).
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <string_view>
#include <vector>

#include "commands.h"
#include "titan/backend/cpu/threads.h"
#include "titan/core/error.h"

namespace titan::cli {

void add_threads_option(CLI::App& command, int& threads) {
  threads = default_thread_count();
  command.add_option("--threads", threads, "worker threads (default: physical cores)")
      ->check(CLI::Range(1, 1024));
}

}  // namespace titan::cli

int main(int argc, char** argv) {
  // Decode is ~140 small parallel regions per token: see reexec_with_short_omp_spin.
  if (argc > 1 && std::string_view(argv[1]) == "generate") titan::reexec_with_short_omp_spin(argv);
  CLI::App app{"titan: pre-train, fine-tune and run Qwen3 models"};
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, titan::cli::Action>> commands;
  const auto add = [&](titan::cli::Action action) {
    commands.emplace_back(app.get_subcommands({}).back(), std::move(action));
  };
  add(titan::cli::add_info_command(app));
  add(titan::cli::add_convert_command(app));
  add(titan::cli::add_tokenize_command(app));
  add(titan::cli::add_tokenizer_command(app));
  add(titan::cli::add_train_command(app));
  add(titan::cli::add_eval_command(app));
  add(titan::cli::add_generate_command(app));
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "titan: error: %s (run 'titan --help')\n", e.what());
    return 2;
  }
  for (auto& [command, action] : commands) {
    if (!command->parsed()) continue;
    try {
      return action();
    } catch (const titan::Error& e) {
      std::fprintf(stderr, "titan %s: error: %s\n", command->get_name().c_str(), e.what());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "titan %s: internal error: %s\n", command->get_name().c_str(), e.what());
    }
    return 1;
  }
  return 2;
}
