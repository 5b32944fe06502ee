// `titan tokenizer train` and `titan tokenize --bin`: files written as the library writes them,
// throughput on stderr, and one error line (and no output file) for bad input.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_dataset_util.h"
#include "test_hostile_inputs.h"
#include "test_tokenizer_python.h"
#include "titan/data/dataset.h"
#include "titan_cli_run.h"

namespace titan {
namespace {

using nlohmann::json;
using test::ScratchDir;
using test::write_text;

using test::run_titan;
using test::TitanRun;

// One training step of the tiny model on `dataset` (with the test tokenizer) that must fail with
// `error` as its last stderr line.
void expect_train_error(const std::string& dataset, const ScratchDir& dir,
                        const std::string& error) {
  const TitanRun r = run_titan(
      "train --training.dataset=files --training.dataset_path='" + dataset +
          "' --model.flavor=tiny --model.hf_assets_path='" + test::trained_tokenizer_dir() +
          "' --training.steps=1 --lr_scheduler.warmup_steps=0 --training.seq_len=16 "
          "--job.dump_folder='" +
          (dir / "run") + "' --threads 2",
      dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_TRUE(r.err.ends_with("\ntitan train: error: " + error) ||
              r.err == "titan train: error: " + error)
      << r.err;
}

TEST(DatasetCommand, TokenizerTrainWritesWhatTheLibraryWrites) {
  const ScratchDir dir("cli_train");
  const TitanRun r = run_titan(
      "tokenizer train --vocab-size 2048 --out '" + (dir / "tok") + "' " + default_corpus(), dir);
  ASSERT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("-> 2048 ids"), std::string::npos) << r.err;
  for (const char* file : {"/tokenizer.json", "/tokenizer_config.json"}) {
    EXPECT_EQ(test::read_bytes(dir / ("tok" + std::string(file))),
              test::read_bytes(test::trained_tokenizer_dir() + file))
        << file;
  }
  const TitanRun bad = run_titan(
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
  const TitanRun r =
      run_titan("tokenize --threads 2 --tokenizer '" + test::trained_tokenizer_dir() + "' --bin '" +
                    (dir / "out.bin") + "' '" + (dir / "in") + "'",
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
  TitanRun r = run_titan(base + "' '" + (dir / "a.jsonl") + "'", dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err,
            "titan tokenize: error: " + (dir / "a.jsonl") + ":2: \"text\" is not a string\n");
  EXPECT_FALSE(std::filesystem::exists(dir / "out.bin"));
  size_t n_files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir.path())) ++n_files;
  EXPECT_EQ(n_files, 3u) << "a.jsonl, stdout, stderr and no temporary file";

  r = run_titan(base + "' --skip-bad-lines '" + (dir / "a.jsonl") + "'", dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("skipped 1 bad record(s); the first: " + (dir / "a.jsonl") + ":2:"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(DocumentFile::open(dir / "out.bin", {}).size(), 1u);

  std::string gz = "\x1f\x8b\x08\x00\x00\x00\x00\x00";
  write_text(dir / "cut.txt.gz", gz);
  r = run_titan(base + "2' '" + (dir / "cut.txt.gz") + "'", dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(
      r.err.rfind("titan tokenize: error: " + (dir / "cut.txt.gz") + ": truncated gzip stream", 0),
      0u)
      << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1);
}

// Issue 12's hostile inputs: each ends as one error line naming the file and exit status 1 (a
// crash would be a signal), and leaves the input as it was.
TEST(DatasetCommand, DeeplyNestedNormalizerIsRefused) {
  const ScratchDir dir("cli_deep_normalizer");
  const std::string tokenizer =
      test::with_normalizer(test::read_bytes(test::trained_tokenizer_dir() + "/tokenizer.json"),
                            test::nested_sequence_normalizer(200'000));
  write_text(dir / "tok/tokenizer.json", tokenizer);
  const TitanRun r = run_titan("tokenize --tokenizer '" + (dir / "tok") + "' --text hello", dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "titan tokenize: error: " + (dir / "tok/tokenizer.json") +
                       ": tokenizer.json nests deeper than 128 levels\n");
  EXPECT_EQ(test::read_bytes(dir / "tok/tokenizer.json"), tokenizer);
}

TEST(DatasetCommand, DeeplyNestedIdsAreRefused) {
  const ScratchDir dir("cli_deep_ids");
  const std::string data = "{\"ids\": [1, 2]}\n" + test::deeply_nested_ids_record(100'000);
  write_text(dir / "a.jsonl", data);
  const std::string error = dir / "a.jsonl:2: the record nests deeper than 128 levels\n";

  TitanRun r = run_titan("tokenize --tokenizer '" + test::trained_tokenizer_dir() + "' --bin '" +
                             (dir / "out.bin") + "' '" + (dir / "a.jsonl") + "'",
                         dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "titan tokenize: error: " + error);
  EXPECT_FALSE(std::filesystem::exists(dir / "out.bin"));

  expect_train_error(dir / "a.jsonl", dir, error);
  EXPECT_EQ(test::read_bytes(dir / "a.jsonl"), data);
}

TEST(DatasetCommand, GzipBombStopsAtTheLimit) {
  const ScratchDir dir("cli_gzip_bomb");
  const std::string bomb = dir / "bomb.jsonl.gz";
  test::write_gzip_bomb(bomb, 64);
  const std::string compressed = test::read_bytes(bomb);
  ASSERT_LT(compressed.size(), size_t{1} << 20);
  const std::string tokenize = "tokenize --threads 2 --tokenizer '" +
                               test::trained_tokenizer_dir() + "' --bin '" + (dir / "out.bin") +
                               "' '" + bomb + "'";
  const std::string error = bomb +
                            ": decompresses to more than 16777216 bytes, the limit for one gzip "
                            "file (set TITAN_GUNZIP_LIMIT, e.g. to 64GiB, to raise it, or split "
                            "the file)\n";
  ASSERT_EQ(setenv("TITAN_GUNZIP_LIMIT", "16MiB", 1), 0);
  TitanRun r = run_titan(tokenize, dir);
  EXPECT_EQ(r.status, 1);
  EXPECT_EQ(r.err, "titan tokenize: error: " + error);
  EXPECT_FALSE(std::filesystem::exists(dir / "out.bin"));
  expect_train_error(bomb, dir, error);
  // Raised to the file's size, the same file is read.
  ASSERT_EQ(setenv("TITAN_GUNZIP_LIMIT", "64MiB", 1), 0);
  r = run_titan(tokenize, dir);
  ASSERT_EQ(unsetenv("TITAN_GUNZIP_LIMIT"), 0);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(r.err.find("1 files, 16384 documents"), std::string::npos) << r.err;
  EXPECT_EQ(test::read_bytes(bomb), compressed);
}

}  // namespace
}  // namespace titan
