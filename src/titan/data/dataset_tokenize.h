// Tokenizing a whole dataset into one token file (token_file.h), as `titan tokenize --bin` does:
// every document of every file, in sorted file order and file order, no shuffle, no sharding.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "titan/data/dataset.h"
#include "titan/data/tokenizer.h"

namespace titan {

struct TokenizeStats {
  int64_t n_files = 0, n_docs = 0, n_tokens = 0, n_skipped = 0;
  std::string first_skipped;  // the message of the first skipped record
  double seconds = 0;
};

// The ranks of a job tokenizing one dataset together (`titan tokenize --bin` under mpirun): each
// tokenizes 1/N of every batch of documents, the lengths are summed and the tokens gathered on rank
// 0, which alone writes the file -- the bytes one process writes. Default: one process.
struct TokenizeRanks {
  int rank = 0, size = 1;
  // values (count) = their sum over the ranks, in place.
  std::function<void(double* values, int64_t count)> sum;
  // On rank 0, `all` = every rank's `mine`, one after another in rank order; elsewhere untouched.
  std::function<void(const std::vector<int32_t>& mine, std::vector<int32_t>& all)> gather;
};

// Writes out_path atomically (temporary name, then rename). out_path must not be an input (or lie
// inside an input folder), and an existing out_path is replaced only if it is a token file.
// Documents are tokenized in parallel on the engine's threads (thread_count()). Chat data cannot be
// written: a token file has no loss mask. Bad records stop it (naming file and line) unless
// data.skip_bad_records, when they are counted in n_skipped.
// With several `ranks`, rank 0 writes and returns the stats; the others write nothing.
TokenizeStats tokenize_to_token_file(const Tokenizer& tok, const DatasetOptions& data,
                                     const std::string& out_path, const TokenizeRanks& ranks = {});

// The tokens the pre-training loader packs from the data: every document's ids (text encoded as
// the loader encodes it) and the EOS after each non-empty one. Read sequentially: for messages
// about small data (titan eval on a file shorter than one batch), not for a corpus.
int64_t count_packed_tokens(const Tokenizer& tok, const DatasetOptions& data);

}  // namespace titan
