// titan tokenizer train --vocab-size N --out DIR FILES...: trains a byte-level BPE tokenizer on
// the text of dataset files (text, JSON Lines, JSON, gzip) and writes a Hugging Face tokenizer.json
// and tokenizer_config.json as the new folder DIR (--overwrite: replacing one titan wrote).
#include <cstdio>

#include "commands.h"
#include "titan/data/tokenizer_train.h"

namespace titan::cli {
namespace {

struct TokenizerTrainOptions {
  DatasetOptions data;
  BpeTrainerOptions bpe;
  std::string out;
  bool overwrite = false;
};

int run_train(const TokenizerTrainOptions& o) {
  const TokenizerTrainStats s = train_tokenizer(o.data, o.bpe, o.out, o.overwrite);
  std::fprintf(stderr,
               "tokenizer train: %lld documents, %lld bytes -> %zu ids (%zu asked) in %.2f s; "
               "wrote %s\n",
               static_cast<long long>(s.n_docs), static_cast<long long>(s.n_bytes), s.vocab_size,
               o.bpe.vocab_size, s.seconds, o.out.c_str());
  return 0;
}

}  // namespace

Action add_tokenizer_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand("tokenizer", "train a byte-level BPE tokenizer");
  command->require_subcommand(1);
  CLI::App* train = command->add_subcommand(
      "train", "train on the text of dataset files and write an HF tokenizer.json");
  static TokenizerTrainOptions o;
  train
      ->add_option("--vocab-size", o.bpe.vocab_size,
                   "ids in total, the special tokens included (default 2048)")
      ->check(CLI::Range(259, 1 << 24));
  train->add_option("--out", o.out, "output folder (new or empty)")->required();
  train->add_flag("--overwrite", o.overwrite,
                  "replace --out if it is a tokenizer folder titan wrote (its titan.json lists "
                  "every file in it)");
  train->add_option("--text-field", o.data.text_field, "JSON field holding the text")
      ->default_str("text");
  train->add_option("--min-frequency", o.bpe.min_frequency, "fewest occurrences of a merged pair")
      ->check(CLI::PositiveNumber);
  train->add_flag("--skip-bad-lines", o.data.skip_bad_records,
                  "skip unreadable JSON records instead of stopping");
  train->add_option("files", o.data.paths, "files, directories or glob patterns")->required();
  return [] { return run_train(o); };
}

}  // namespace titan::cli
