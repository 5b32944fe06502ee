// Running a Python reference script from tests/reference/ with the pinned interpreter
// ($TITAN_PYTHON; ctest sets it and $TITAN_SOURCE_DIR). Shared by every test that compares
// against Transformers, tokenizers or safetensors. Without Python these tests fail, never skip:
// a missing interpreter comes back as a non-zero status that the caller asserts on.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

namespace titan::test {

inline std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

struct PythonRun {
  int status;          // pclose's wait status: 0 when the script exited 0, -1 when it never ran
  std::string output;  // its stdout and stderr together, or why it never ran
};

// Runs `$TITAN_PYTHON $TITAN_SOURCE_DIR/tests/reference/SCRIPT ARGS...`, each word quoted.
inline PythonRun run_python_script(const std::string& script,
                                   const std::vector<std::string>& args) {
  const std::string python = env_or_empty("TITAN_PYTHON");
  const std::string source = env_or_empty("TITAN_SOURCE_DIR");
  if (python.empty() || source.empty() || !std::filesystem::exists(python)) {
    return {-1, "TITAN_PYTHON / TITAN_SOURCE_DIR unset or missing (run scripts/setup.sh --python)"};
  }
  std::string cmd = "'" + python + "' '" + source + "/tests/reference/" + script + "'";
  for (const std::string& a : args) cmd += " '" + a + "'";
  cmd += " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (pipe == nullptr) return {-1, "could not start: " + cmd};
  PythonRun run{-1, ""};
  char buf[4096];
  while (size_t n = std::fread(buf, 1, sizeof buf, pipe)) run.output.append(buf, n);
  run.status = ::pclose(pipe);
  return run;
}

}  // namespace titan::test
