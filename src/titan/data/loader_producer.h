// The loader's synchronous core: walks the documents in the seeded order for one rank, tokenizes
// them and packs rows (the rules are in loader.h). DataLoader runs it on its background thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "titan/data/dataset.h"
#include "titan/data/loader.h"
#include "titan/data/loader_carry.h"
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
  // The position after the last batch next() filled, its carried tokens unread where another
  // rank's rows of a token file left them (LoaderPosition::read reads them).
  LoaderPosition position() const;
  // The same, read.
  LoaderState state() const { return position().read(); }
  // Documents tokenized so far (text encoded, conversations rendered and encoded; those read for a
  // carried token too): what a rank that trains on a share of the batches is spared
  // (LoaderOptions::share).
  int64_t tokenized() const { return *tokenized_; }
  // Tokens read from token files so far (TokenFileReader::tokens_read of every file this producer
  // opened, carries read after their file closed aside): another rank's packed rows add none.
  uint64_t tokens_read() const;

 private:
  struct Document {
    std::vector<int32_t> ids, labels;  // labels empty in pre-training (they equal the ids)
    std::string where;
    bool skimmed = false;  // another rank's conversation, read but not tokenized (ids empty)
    size_t length = 0;     // pre-training: its tokens and EOS
    // Pre-training from a token file: the file and the document's index in it. Its length comes
    // from the file's table and its tokens (ids empty) are read a row's stretch at a time, so
    // that a rank reads only what its own rows hold.
    std::shared_ptr<const TokenFileReader> token_file;
    size_t file_doc = 0;
    // Another rank's text document or packed conversation, its length from the ranks' sums:
    // tokenized (into ids and labels) only when this rank's row or carried token reaches it.
    std::shared_ptr<const UnreadDocument> unread;
  };
  // What a length in the ranks' sums says of a record that cannot be read, and of one that reads
  // but does not encode (a tool turn under a Llama template, ...).
  static constexpr int64_t kBadRecord = -1;
  static constexpr int64_t kUnencodable = -2;

  bool next_row(int32_t* ids, int32_t* labels);
  bool pack_row(int32_t* ids, int32_t* labels);
  // Another rank's packed row: the stream advanced as pack_row does, no token copied (token-file
  // documents unread, the carry left unread: CarriedTokens); the row left empty.
  bool skip_packed_row(int32_t* ids, int32_t* labels);
  // n tokens of the loaded document packed: on to the next document at its end.
  void advance(size_t n);
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
  // only read: skims_rows; packed text or conversations measured by the ranks' sums:
  // shares_lengths); false when it is skipped as bad. `alone`: no sum over the ranks (a resume's
  // first document).
  bool read_document(int64_t doc, Document& out, bool alone = false);
  // Document `doc`'s record, an "ids" record checked against the vocabulary (BadRecordError).
  Record read_record(int64_t doc) const;
  // A skipped bad record counted (`message` its error's), or `error` rethrown without
  // skip_bad_records.
  bool skip_bad_record(std::exception_ptr error, const std::string& message);
  // Packed text or conversations shared over data-parallel ranks: document `doc` measured by the
  // window of lengths holding it, its tokens this rank's if it tokenized it, else left unread.
  bool read_shared_document(int64_t doc, Document& out);
  // The window of documents from `doc` on: this rank tokenizes its part, the ranks sum the
  // lengths (LoaderOptions::sum_over_ranks).
  void share_lengths(int64_t doc);
  struct WindowDocument;
  // The error of document `doc`, which a rank failed to encode (kUnencodable): this rank's own,
  // or the same error from encoding it here (the encoding is deterministic), so that every rank
  // stops at it with one line (a JobWideError: rank 0 prints it) instead of the others waiting in
  // the next sum until the job's abort.
  std::string unencodable_error(int64_t doc, const WindowDocument& d) const;
  // LoaderOptions::chat_template, or null (pre-training).
  const ChatTemplate* chat_template() const {
    return options_.chat_template ? &*options_.chat_template : nullptr;
  }
  // An unread document's ids (and labels), made now.
  void read_ids(Document& d);
  // Whether documents are measured by the ranks' sums of their lengths: packed text, JSON or
  // conversations while the share leaves batches to other ranks.
  bool shares_lengths() const;
  // Whether the batch being filled is another rank's whose rows need no tokens (their bounds are
  // the records': chat data, one conversation per row).
  bool skims_rows() const;
  // Whether documents are measured by the open file's table and read a stretch at a time: a token
  // file in pre-training.
  bool measures_token_file() const;
  void open_file();
  void finish_file();
  // One line to LoaderOptions::warn (default: stderr).
  void warn(const std::string& line) const;
  void close_file();
  std::vector<int64_t> file_order(int64_t epoch) const;

  const LoaderOptions& options_;
  const Tokenizer& tok_;
  std::vector<std::string> files_;
  int32_t eos_ = -1, pad_ = -1;
  LoaderState state_;
  // Set while the carry comes from another rank's rows (state_.carry then empty).
  std::optional<CarriedTokens> unread_carry_;

  // The open file: (epoch, position) it was opened for, its documents for this rank.
  std::shared_ptr<const DocumentFile> file_;
  int64_t file_epoch_ = -1, file_pos_ = -1;
  std::vector<int64_t> own_docs_;  // this rank's document indices, in visiting order
  int64_t file_skipped_ = 0;       // bad records skipped in the open file
  std::string file_first_skip_;    // the first of them, for the warning
  bool doc_loaded_ = false;        // doc_ holds document state_.doc
  Document doc_;
  int64_t empty_epochs_ = 0;  // epochs passed without a document, to stop instead of spinning
  bool own_batch_ = true;     // the batch being filled is this rank's (LoaderOptions::share)
  // Shared with the UnreadDocuments, which count when they are read (for a row or a carry).
  std::shared_ptr<std::atomic<int64_t>> tokenized_ = std::make_shared<std::atomic<int64_t>>(0);
  // Packed text or conversations over data-parallel ranks (shares_lengths): this rank of
  // dp_ranks_, and the open file's window of documents [window_begin_, window_begin_ +
  // window_lengths_.size()): each one's length (text: its tokens and EOS; kBadRecord: not
  // readable), and of those this rank read, the tokens and record's place, or the error.
  struct WindowDocument {
    DocumentTokens tokens;
    std::string where;
    std::exception_ptr error;
  };
  int64_t dp_ranks_ = 1, dp_rank_ = 0;
  int64_t window_begin_ = 0;
  std::vector<int64_t> window_lengths_;
  std::vector<WindowDocument> window_docs_;
  uint64_t closed_tokens_read_ = 0;  // tokens_read of the files closed so far
};

}  // namespace titan
