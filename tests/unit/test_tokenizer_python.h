// Shared by the tokenizer tests: where the real Qwen3 tokenizer files are, and running a Python
// reference script from tests/reference/ (JSON request in, JSON response out, through files).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "python_runner.h"
#include "scratch_dir.h"

namespace titan::test {

// $TITAN_QWEN3_TOKENIZER, else the copy in the repository, tests/fixtures/qwen3-tokenizer
// (tests/fixtures/README.md).
inline std::string qwen3_tokenizer_dir() {
  std::string dir = env_or_empty("TITAN_QWEN3_TOKENIZER");
  if (dir.empty()) dir = env_or_empty("TITAN_SOURCE_DIR") + "/tests/fixtures/qwen3-tokenizer";
  return dir;
}

// Runs `$TITAN_PYTHON tests/reference/SCRIPT ARGS... REQUEST RESPONSE` and returns RESPONSE.
// A missing interpreter or a failing script fails the test (never skips it).
inline nlohmann::json run_reference(const std::string& script, const std::vector<std::string>& args,
                                    const nlohmann::json& request) {
  const ScratchDir dir("reference");
  const auto in = dir.path() / (script + ".request.json");
  const auto out = dir.path() / (script + ".response.json");
  std::ofstream(in) << request.dump();
  std::vector<std::string> words = args;
  words.push_back(in.string());
  words.push_back(out.string());
  const PythonRun run = run_python_script(script, words);
  EXPECT_EQ(run.status, 0) << "reference " << script << " failed:\n" << run.output;
  std::ifstream response(out);
  EXPECT_TRUE(response.good()) << "no response from " << script;
  nlohmann::json result;
  if (run.status == 0 && response.good()) response >> result;
  return result;
}

}  // namespace titan::test
