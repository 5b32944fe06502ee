// The `titan` binary of this build run as a user runs it, for the command-line tests: `args`
// (already shell-quoted) after the binary, stdin from `input` (a file in `dir`), stdout and stderr
// captured through files in `dir` (a scratch folder the test owns: a ScratchDir, a ScratchDir or a
// path).
#pragma once

#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "python_runner.h"

namespace titan::test {

struct TitanRun {
  int status = -1;  // the exit status; -1 when a signal ended it
  int signal = 0;   // that signal
  std::string out, err;
};

template <typename Dir>
TitanRun run_titan(const std::string& args, const Dir& dir, const std::string& input = "") {
  const std::string titan = env_or_empty("TITAN_BINARY_DIR") + "/titan";
  const auto file = [&](const char* name) { return std::filesystem::path(dir / name).string(); };
  // No input: stdin at end of file, and no file beside the ones a test counts.
  const std::string in = input.empty() ? "/dev/null" : file("stdin");
  const std::string out = file("stdout"), err = file("stderr");
  if (!input.empty()) std::ofstream(in) << input;
  const std::string cmd =
      "'" + titan + "' " + args + " < '" + in + "' > '" + out + "' 2> '" + err + "'";
  const int raw = std::system(cmd.c_str());
  const auto slurp = [](const std::string& path) {
    std::ifstream f(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(f), {});
  };
  TitanRun r;
  if (WIFEXITED(raw)) r.status = WEXITSTATUS(raw);
  if (WIFSIGNALED(raw)) r.signal = WTERMSIG(raw);
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

}  // namespace titan::test
