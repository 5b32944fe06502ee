// The titan command line: one binary, one subcommand per job. Every error raised anywhere below
// arrives here and leaves as one line on stderr and exit status 1 (2 for a malformed command line).
#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <exception>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "commands.h"
#include "titan/backend/cpu/threads.h"
#include "titan/core/error.h"
#include "titan/distributed/world.h"

namespace titan::cli {

void add_threads_option(CLI::App& command, int& threads) {
  threads = default_thread_count();
  command.add_option("--threads", threads, "worker threads (default: physical cores)")
      ->check(CLI::Range(1, 1024));
}

}  // namespace titan::cli

namespace {

// Prints the error and ends the job. Under mpirun the error is prefixed with the failing rank and
// every rank is ended (a rank left alone would wait forever in its next collective). When every
// rank fails the same way (a config mistake), rank 0's line comes first and its abort ends the
// others before they print: the other ranks wait half a second before printing.
int report_error(const std::string& line, int status) {
  const titan::WorldInfo& w = titan::world_info();
  if (w.size == 1) {
    std::fprintf(stderr, "%s\n", line.c_str());
    return status;
  }
  if (w.rank != 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
  std::fprintf(stderr, "[rank %d of %d] %s\n", w.rank, w.size, line.c_str());
  std::fflush(stderr);
  titan::abort_world(status);
}

// A titan::JobWideError: every rank raised the same line, so rank 0's report stands for the job.
// The other ranks wait for its abort to end them; should it not come (rank 0 stuck), each reports
// its own line after half a minute.
int report_job_wide_error(const std::string& line, int status) {
  const titan::WorldInfo& w = titan::world_info();
  if (w.size > 1 && w.rank != 0) std::this_thread::sleep_for(std::chrono::seconds(30));
  return report_error(line, status);
}

}  // namespace

int main(int argc, char** argv) {
  // Decode is ~140 small parallel regions per token, and a training step's team threads spinning
  // for libgomp's default few ms at every barrier hold the cores that other processes (or a
  // descheduled team thread) need: see reexec_with_short_omp_spin.
  if (argc > 1 &&
      (std::string_view(argv[1]) == "generate" || std::string_view(argv[1]) == "train")) {
    titan::reexec_with_short_omp_spin(argv);
  }
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
  add(titan::cli::add_plan_command(app));
  add(titan::cli::add_eval_command(app));
  add(titan::cli::add_generate_command(app));
  add(titan::cli::add_launch_command(app));
  add(titan::cli::add_verify_kernels_command(app));
  try {
    titan::init_world(&argc, &argv);
  } catch (const std::exception& e) {
    // Under MPI it starts two threads (the communication stream and its watchdog); a rank short of
    // memory or of threads cannot.
    return report_error(
        std::string("titan: error: cannot start the communication threads: ") + e.what(), 1);
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    return report_error(std::string("titan: error: ") + e.what() + " (run 'titan --help')", 2);
  }
  for (auto& [command, action] : commands) {
    if (!command->parsed()) continue;
    const std::string name = command->get_name();
    // titan tokenize checks itself that it writes a token file (--bin), the one form that shares.
    if (titan::world_info().size > 1 && name != "train" && name != "tokenize") {
      return report_error("titan " + name +
                              ": error: runs in one process; under mpirun (or titan launch) only "
                              "titan train and titan tokenize --bin run",
                          2);
    }
    // One rank speaks for the job; every rank's errors and warnings still reach stderr.
    if (titan::world_info().rank != 0 && std::freopen("/dev/null", "w", stdout) == nullptr) {
      return report_error("titan: error: cannot silence the output of rank " +
                              std::to_string(titan::world_info().rank),
                          1);
    }
    try {
      const int status = action();
      titan::finalize_world();
      return status;
    } catch (const titan::JobWideError& e) {
      return report_job_wide_error("titan " + name + ": error: " + e.what(), 1);
    } catch (const titan::Error& e) {
      return report_error("titan " + name + ": error: " + e.what(), 1);
    } catch (const std::exception& e) {
      return report_error("titan " + name + ": internal error: " + e.what(), 1);
    }
  }
  return 2;
}
