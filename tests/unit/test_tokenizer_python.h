// Shared by the tokenizer tests: where the real Qwen3 tokenizer files are, and running a Python
// reference script from tests/reference/ (JSON request in, JSON response out, through files).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

namespace titan::test {

inline std::string env_or_empty(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// $TITAN_QWEN3_TOKENIZER, else ../shared/assets/qwen3-tokenizer next to the source tree.
inline std::string qwen3_tokenizer_dir() {
  std::string dir = env_or_empty("TITAN_QWEN3_TOKENIZER");
  if (dir.empty()) dir = env_or_empty("TITAN_SOURCE_DIR") + "/../shared/assets/qwen3-tokenizer";
  return dir;
}

// A fresh folder for one test's files, unique per process.
inline std::filesystem::path scratch_dir(const std::string& name) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("titan_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir;
}

// Runs `$TITAN_PYTHON tests/reference/SCRIPT ARGS... REQUEST RESPONSE` and returns RESPONSE.
// A missing interpreter or a failing script fails the test (never skips it).
inline nlohmann::json run_reference(const std::string& script, const std::vector<std::string>& args,
                                    const nlohmann::json& request) {
  const std::string python = env_or_empty("TITAN_PYTHON");
  const std::string source = env_or_empty("TITAN_SOURCE_DIR");
  EXPECT_FALSE(python.empty()) << "TITAN_PYTHON is not set (run through ctest)";
  EXPECT_FALSE(source.empty()) << "TITAN_SOURCE_DIR is not set (run through ctest)";
  EXPECT_TRUE(std::filesystem::exists(python)) << python << " does not exist";
  const auto dir = scratch_dir("reference");
  const auto in = dir / (script + ".request.json");
  const auto out = dir / (script + ".response.json");
  std::ofstream(in) << request.dump();
  std::string cmd = "'" + python + "' '" + source + "/tests/reference/" + script + "'";
  for (const std::string& a : args) cmd += " '" + a + "'";
  cmd += " '" + in.string() + "' '" + out.string() + "'";
  const int rc = std::system(cmd.c_str());
  EXPECT_EQ(rc, 0) << "reference failed: " << cmd;
  std::ifstream response(out);
  EXPECT_TRUE(response.good()) << "no response from " << cmd;
  nlohmann::json result;
  if (rc == 0 && response.good()) response >> result;
  std::filesystem::remove_all(dir);
  return result;
}

}  // namespace titan::test
