// `titan tokenize`: JSON Lines both ways, --text, and one-line errors for bad input lines.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <sstream>

#include "test_tokenizer_python.h"
#include "titan/data/tokenizer.h"
#include "titan_cli_run.h"

namespace titan {
namespace {

using nlohmann::json;

using test::TitanRun;

// Runs `titan tokenize --tokenizer QWEN3 ARGS`, capturing stdout and stderr.
TitanRun tokenize(const std::string& args, const std::filesystem::path& dir) {
  return test::run_titan(
      "tokenize --threads 2 --tokenizer '" + test::qwen3_tokenizer_dir() + "' " + args, dir);
}

std::vector<std::string> lines_of(const std::string& s) {
  std::vector<std::string> lines;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(TokenizeCommand, TextPrintsIds) {
  const test::ScratchDir dir("cli_text");
  const TitanRun r = tokenize("--text 'Hello, world!'", dir.path());
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, "9707 11 1879 0\n");
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos);
  const TitanRun d = tokenize("--decode --text '9707 11 1879 0'", dir.path());
  EXPECT_EQ(d.out, "Hello, world!\n");
}

TEST(TokenizeCommand, JsonlRoundTripKeepsOrder) {
  const test::ScratchDir dir("cli_jsonl");
  const Tokenizer tok = Tokenizer::load(test::qwen3_tokenizer_dir());
  std::vector<std::string> texts;
  for (int i = 0; i < 20000; ++i) {
    texts.push_back("doc " + std::to_string(i) + (i % 3 ? " 你好，世界 🙂" : "\n\tcode  x") +
                    (i % 7 ? "" : "<|im_end|>"));
  }
  {
    std::ofstream in(dir / "in.jsonl");
    for (const std::string& t : texts) in << json{{"text", t}}.dump() << "\n";
  }
  const TitanRun enc = tokenize(
      "--jsonl '" + (dir / "in.jsonl") + "' --out '" + (dir / "ids.jsonl") + "'", dir.path());
  ASSERT_EQ(enc.status, 0) << enc.err;
  std::ifstream ids_file(dir / "ids.jsonl");
  const std::vector<std::string> id_lines =
      lines_of(std::string(std::istreambuf_iterator<char>(ids_file), {}));
  ASSERT_EQ(id_lines.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    ASSERT_EQ(json::parse(id_lines[i])["ids"].get<std::vector<int32_t>>(), tok.encode(texts[i]))
        << "line " << i + 1;
  }
  const TitanRun dec = tokenize("--decode --jsonl '" + (dir / "ids.jsonl") + "'", dir.path());
  ASSERT_EQ(dec.status, 0) << dec.err;
  const std::vector<std::string> text_lines = lines_of(dec.out);
  ASSERT_EQ(text_lines.size(), texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    ASSERT_EQ(json::parse(text_lines[i])["text"], texts[i]) << "line " << i + 1;
  }
}

TEST(TokenizeCommand, BadLinesFailWithOneLineNamingFileAndLine) {
  const test::ScratchDir dir("cli_bad");
  const auto in = dir.path() / "in.jsonl", out = dir.path() / "out.jsonl";
  const auto expect_error = [&](const std::string& content, const std::string& flags,
                                const std::string& message) {
    std::ofstream(in) << content;
    const TitanRun r =
        tokenize(flags + " --jsonl '" + in.string() + "' --out '" + out.string() + "'", dir.path());
    EXPECT_NE(r.status, 0);
    EXPECT_NE(r.err.find(in.string() + ":2: " + message), std::string::npos) << r.err;
    EXPECT_EQ(lines_of(r.err).size(), 1u) << r.err;
    EXPECT_FALSE(std::filesystem::exists(out));
  };
  expect_error("{\"text\": \"a\"}\n{\"text\": \"b\"\n", "", "the record is not valid JSON");
  expect_error("{\"text\": \"a\"}\n{\"txt\": \"b\"}\n", "", "no string \"text\" field");
  expect_error("{\"ids\": [1]}\n{\"ids\": [1, 151669]}\n", "--decode",
               "id 151669 is outside the vocabulary");
}

}  // namespace
}  // namespace titan
