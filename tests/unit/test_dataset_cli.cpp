// `titan tokenizer train` and `titan tokenize --bin`: files written as the library writes them,
// throughput on stderr, and one error line (and no output file) for bad input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_dataset_util.h"
#include "test_tokenizer_python.h"
#include "titan/data/dataset.h"

namespace titan {
namespace {

using nlohmann::json;
using test::ScratchDir;
using test::write_text;

struct CommandResult {
  int status;
  std::string err;
};

CommandResult titan_command(const std::string& args, const ScratchDir& dir) {
  const std::string titan = test::env_or_empty("TITAN_BINARY_DIR") + "/titan";
  const std::string cmd =
      "'" + titan + "' " + args + " > '" + (dir / "stdout") + "' 2> '" + (dir / "stderr") + "'";
  const int rc = std::system(cmd.c_str());
  return {WIFEXITED(rc) ? WEXITSTATUS(rc) : -1, test::read_bytes(dir / "stderr")};
}

TEST(DatasetCommand, TokenizerTrainWritesWhatTheLibraryWrites) {
  const ScratchDir dir("cli_train");
  const CommandResult r = titan_command(
      "tokenizer train --vocab-size 2048 --out '" + (dir / "tok") + "' " + default_corpus(), dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("-> 2048 ids"), std::string::npos) << r.err;
  for (const char* file : {"/tokenizer.json", "/tokenizer_config.json"}) {
    EXPECT_EQ(test::read_bytes(dir / ("tok" + std::string(file))),
              test::read_bytes(test::trained_tokenizer_dir() + file))
        << file;
  }
  const CommandResult bad = titan_command(
      "tokenizer train --vocab-size 300 --out '" + (dir / "x") + "' '" + (dir / "missing") + "'",
      dir);
  EXPECT_EQ(bad.status, 1);
  EXPECT_EQ(bad.err,
            "titan tokenizer: error: " + (dir / "missing") + ": no such file or directory\n");
}

TEST(DatasetCommand, TokenizeBinWritesATokenFile) {
  const ScratchDir dir("cli_bin");
  const Tokenizer& tok = test::trained_tokenizer();
  write_text(dir / "in/a.jsonl", json{{"text", "first"}}.dump() + "\n" +
                                     json{{"text", "second <|endoftext|>"}}.dump() + "\n");
  test::write_gzip(dir / "in/b.txt.gz", "third\n\nfourth\n");
  const CommandResult r =
      titan_command("tokenize --threads 2 --tokenizer '" + test::trained_tokenizer_dir() +
                        "' --bin '" + (dir / "out.bin") + "' '" + (dir / "in") + "'",
                    dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("tokens/s"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("2 files, 4 documents"), std::string::npos) << r.err;
  const DocumentFile f = DocumentFile::open(dir / "out.bin", {});
  ASSERT_EQ(f.size(), 4u);
  const std::vector<std::string> texts = {"first", "second <|endoftext|>", "third", "fourth"};
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(f.record(i, DataMode::pretrain).ids, tok.encode(texts[i])) << i;
  }
}

TEST(DatasetCommand, TokenizeBinBadInputLeavesNoFile) {
  const ScratchDir dir("cli_bin_bad");
  write_text(dir / "a.jsonl", "{\"text\": \"ok\"}\n{\"text\": 1}\n");
  const std::string base =
      "tokenize --tokenizer '" + test::trained_tokenizer_dir() + "' --bin '" + (dir / "out.bin");
  CommandResult r = titan_command(base + "' '" + (dir / "a.jsonl") + "'", dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err,
            "titan tokenize: error: " + (dir / "a.jsonl") + ":2: \"text\" is not a string\n");
  EXPECT_FALSE(std::filesystem::exists(dir / "out.bin"));
  size_t n_files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path)) ++n_files;
  EXPECT_EQ(n_files, 3u) << "a.jsonl, stdout, stderr and no temporary file";

  r = titan_command(base + "' --skip-bad-lines '" + (dir / "a.jsonl") + "'", dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("skipped 1 bad record(s); the first: " + (dir / "a.jsonl") + ":2:"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(DocumentFile::open(dir / "out.bin", {}).size(), 1u);

  std::string gz = "\x1f\x8b\x08\x00\x00\x00\x00\x00";
  write_text(dir / "cut.txt.gz", gz);
  r = titan_command(base + "2' '" + (dir / "cut.txt.gz") + "'", dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(
      r.err.rfind("titan tokenize: error: " + (dir / "cut.txt.gz") + ": truncated gzip stream", 0),
      0u)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
}

}  // namespace
}  // namespace titan
