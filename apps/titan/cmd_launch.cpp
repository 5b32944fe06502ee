// `titan launch --nproc N train ...`: runs titan train on N ranks of this machine through mpirun,
// with what mpirun needs here -- --allow-run-as-root as root, --oversubscribe when the ranks
// outnumber the cores, no core binding (each rank's threads default to cores / ranks). On several
// machines, call mpirun yourself: `mpirun -np N --hostfile H titan train ...` is the same job.
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "commands.h"
#include "titan/core/error.h"

namespace titan::cli {

Action add_launch_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand("launch",
                                         "run titan train on N processes of this machine through "
                                         "mpirun (data, tensor and sequence parallel)");
  static int nproc = 2;
  static std::string mpirun = "mpirun";
  command->add_option("--nproc", nproc, "ranks to start")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  command->add_option("--mpirun", mpirun, "the mpirun to call")->capture_default_str();
  command->prefix_command();
  return [command]() -> int {
    std::vector<std::string> rest = command->remaining();
    TITAN_CHECK(
        !rest.empty() && rest.front() == "train",
        "titan launch runs titan train: e.g. titan launch --nproc 2 train --config job.toml",
        rest.empty() ? std::string() : " (got '" + rest.front() + "')");
    char self[4096];
    const ssize_t length = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    TITAN_CHECK(length > 0,
                "cannot find the titan binary (/proc/self/exe): ", std::strerror(errno));
    self[length] = '\0';
    std::vector<std::string> args = {mpirun, "-np", std::to_string(nproc), "--bind-to", "none"};
    if (::geteuid() == 0) args.push_back("--allow-run-as-root");
    if (static_cast<unsigned>(nproc) > std::thread::hardware_concurrency()) {
      args.push_back("--oversubscribe");
    }
    args.push_back(self);
    args.insert(args.end(), rest.begin(), rest.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::fflush(stdout);
    ::execvp(argv[0], argv.data());
    fail("cannot run ", mpirun, ": ", std::strerror(errno),
         " (titan launch needs OpenMPI's mpirun: scripts/setup.sh installs it)");
  };
}

}  // namespace titan::cli
