// The loader's synchronous core: walks the documents in the seeded order for one rank, tokenizes
// them and packs rows (the rules are in loader.h). DataLoader runs it on its background thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "titan/data/dataset.h"
#include "titan/data/loader.h"
#include "titan/data/loader_state.h"
#include "titan/data/tokenizer.h"

namespace titan {

class BatchProducer {
 public:
  // files: the expanded, sorted dataset files. start: a state to resume from (checked against the
  // options) or nullopt for the beginning.
  BatchProducer(const LoaderOptions& options, const Tokenizer& tok, std::vector<std::string> files,
                const std::optional<LoaderState>& start);

  // Fills the next batch; false when the epochs are done. The partial batch at the end is dropped
  // in pre-training and kept in chat mode, its missing rows empty (padding, labels -100).
  bool next(Batch& batch);
  // The position after the last batch next() filled.
  const LoaderState& state() const { return state_; }
  // Documents tokenized so far (text encoded, conversations rendered and encoded): what a rank
  // that trains on a share of the batches is spared (LoaderOptions::share).
  int64_t tokenized() const { return tokenized_; }

 private:
  struct Document {
    std::vector<int32_t> ids, labels;  // labels empty in pre-training (they equal the ids)
    std::string where;
    bool skimmed = false;  // another rank's conversation, read but not tokenized (ids empty)
  };

  bool next_row(int32_t* ids, int32_t* labels);
  bool pack_row(int32_t* ids, int32_t* labels);
  bool chat_row(int32_t* ids, int32_t* labels);
  // Conversations one after another into a row while they fit, their starts into `starts`.
  bool packed_chat_row(int32_t* ids, int32_t* labels, int32_t* starts);
  // The loaded conversation's length, cut to seq_len + 1 when allowed (else a titan::Error naming
  // its record), and whether it was cut.
  size_t chat_length(bool& cut) const;
  // Loads this rank's document state_.doc of the current file into doc_, moving on across files
  // and epochs and past skipped records; false when the epochs are done.
  bool load_document();
  // Tokenizes this rank's document `doc` of the open file (a conversation of another rank's row
  // only read: skims_rows); false when it is skipped as bad.
  bool read_document(int64_t doc, Document& out);
  // Whether the batch being filled is another rank's whose rows need no tokens (their bounds are
  // the records': chat data, one conversation per row).
  bool skims_rows() const;
  void open_file();
  void finish_file();
  std::vector<int64_t> file_order(int64_t epoch) const;

  const LoaderOptions& options_;
  const Tokenizer& tok_;
  std::vector<std::string> files_;
  int32_t eos_ = -1, pad_ = -1;
  LoaderState state_;

  // The open file: (epoch, position) it was opened for, its documents for this rank.
  std::optional<DocumentFile> file_;
  int64_t file_epoch_ = -1, file_pos_ = -1;
  std::vector<int64_t> own_docs_;  // this rank's document indices, in visiting order
  int64_t file_skipped_ = 0;       // bad records skipped in the open file
  std::string file_first_skip_;    // the first of them, for the warning
  bool doc_loaded_ = false;        // doc_ holds document state_.doc
  Document doc_;
  int64_t empty_epochs_ = 0;  // epochs passed without a document, to stop instead of spinning
  bool own_batch_ = true;     // the batch being filled is this rank's (LoaderOptions::share)
  int64_t tokenized_ = 0;
};

}  // namespace titan
