// Training a tokenizer from dataset files (any format dataset.h reads, text records only) and the
// default corpus and tokenizer that `titan train` uses when given none.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "titan/data/bpe_trainer.h"
#include "titan/data/dataset.h"

namespace titan {

struct TokenizerTrainStats {
  int64_t n_docs = 0, n_bytes = 0;
  size_t vocab_size = 0;  // what was written, special tokens included
  double seconds = 0;
};

// Trains on every text document of data.paths (in sorted file order) and writes the Hugging Face
// tokenizer.json and tokenizer_config.json as the folder out_dir (io/atomic_dir.h: whole or not at
// all). out_dir must be new or empty, or with `overwrite` a tokenizer folder titan wrote; it must
// not be an input or lie inside one. Both are checked before the training.
TokenizerTrainStats train_tokenizer(const DatasetOptions& data, const BpeTrainerOptions& options,
                                    const std::string& out_dir, bool overwrite = false);

// The default corpus: the Jargon File (public domain), from Debian's jargon-text package, which
// scripts/setup.sh installs (docs/DATA.md).
inline constexpr const char* kDefaultCorpus = "/usr/share/doc/jargon-text/jargon.txt.gz";
// The default tokenizer's size: the debugmodel flavor's vocab_size.
inline constexpr size_t kDefaultVocabSize = 2048;

// kDefaultCorpus, or a titan::Error saying which package to install.
std::string default_corpus();

// Where the default tokenizer is kept: $TITAN_CACHE_DIR, else $XDG_CACHE_HOME/titan, else
// $HOME/.cache/titan, then "debug-tokenizer-v1-2048" (the version changes when training does).
std::string default_tokenizer_dir();

// dir, holding the default tokenizer: trained there from the default corpus first when dir has no
// tokenizer.json (under a second; the result is the same on every machine, so when concurrent
// ranks train it at once, the first folder committed stands and the others are dropped).
std::string ensure_default_tokenizer(const std::string& dir = default_tokenizer_dir());

}  // namespace titan
