// The tokens the loader carries from one row into the next (LoaderState::carry), left unread while
// they come from another data-parallel rank's rows: spans of a token file's documents, read from
// the mapping, or of a text document, tokenized, only when needed -- by this rank's next row, or a
// state to save.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "titan/data/loader_state.h"
#include "titan/data/token_file.h"

namespace titan {

// Appends positions [begin, end) of document `doc` of `file` followed by `eos` (position
// doc_size(doc) is the EOS, so end <= doc_size(doc) + 1): how the loader reads a token file's
// documents, a stretch at a time.
void read_with_eos(const TokenFileReader& file, size_t doc, uint64_t begin, uint64_t end,
                   int32_t eos, std::vector<int32_t>& out);

// A document's tokens: a text document's ids followed by its EOS (labels empty: they are the ids),
// or a conversation's ids and labels (encode_chat).
struct DocumentTokens {
  std::vector<int32_t> ids, labels;
};

// A document's tokens, made the first time they are asked for (once, whichever thread asks):
// another rank's text document or packed conversation, whose length the ranks summed (loader.h),
// tokenized only if this rank needs its tokens -- for its own row, or a carried token.
class UnreadDocument {
 public:
  explicit UnreadDocument(std::function<DocumentTokens()> make) : make_(std::move(make)) {}
  const DocumentTokens& tokens() const;

 private:
  std::function<DocumentTokens()> make_;
  mutable std::once_flag made_;
  mutable DocumentTokens tokens_;
};

class CarriedTokens {
 public:
  CarriedTokens() = default;
  explicit CarriedTokens(std::vector<int32_t> ids);

  size_t size() const { return size_; }
  void append(const int32_t* ids, size_t n);
  // Positions [begin, end) of document `doc` of `file` followed by `eos`: position doc_size(doc)
  // is the EOS, so end <= doc_size(doc) + 1.
  void append_span(std::shared_ptr<const TokenFileReader> file, size_t doc, uint64_t begin,
                   uint64_t end, int32_t eos);
  // Positions [begin, end) of `document`'s ids (end <= their count).
  void append_document(std::shared_ptr<const UnreadDocument> document, uint64_t begin,
                       uint64_t end);
  // Drops all but the last n tokens.
  void keep_last(size_t n);
  // The tokens, read from their files (or tokenized) where they are spans.
  std::vector<int32_t> read() const;

 private:
  struct Piece {
    std::vector<int32_t> ids;                        // known tokens; empty for a span
    std::shared_ptr<const TokenFileReader> file;     // a span of a token file: set
    std::shared_ptr<const UnreadDocument> document;  // a span of a text document: set
    size_t doc = 0;
    uint64_t begin = 0, end = 0;  // positions in the document followed by its EOS
    int32_t eos = 0;
    bool span() const { return file || document; }
    size_t size() const { return span() ? static_cast<size_t>(end - begin) : ids.size(); }
  };
  std::deque<Piece> pieces_;
  size_t size_ = 0;
};

// A loader position whose carried tokens may still be unread.
struct LoaderPosition {
  LoaderState state;                          // its carry empty while unread_carry is set
  std::optional<CarriedTokens> unread_carry;  // the carry, when another rank's rows left it

  // The state with the carry read.
  LoaderState read() const;
};

}  // namespace titan
