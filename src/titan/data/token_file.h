// Pre-tokenized binary token files, written by `titan tokenize --bin` and read by the loader.
//
// Format, version 1, all integers little-endian:
//   offset 0   char[8]  magic "TITANTOK"
//   offset 8   uint32   version (1)
//   offset 12  uint32   vocab_size: every id is < vocab_size (the tokenizer's len(tokenizer))
//   offset 16  uint64   n_tokens
//   offset 24  uint64   n_docs
//   offset 32  uint32   tokens[n_tokens]: the documents' ids back to back, no separators (the
//                       loader joins documents with EOS, as it does for text)
//   then       uint64   doc_ends[n_docs]: end of document i in tokens (exclusive), increasing;
//                       document i is tokens[doc_ends[i-1] .. doc_ends[i]) with doc_ends[-1] = 0
// The file size must be exactly 32 + 4 * n_tokens + 8 * n_docs. The document table is what lets
// the loader shuffle and shard token files by document, like every other format.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "titan/io/atomic_file.h"
#include "titan/io/mapped_file.h"

namespace titan {

inline constexpr std::string_view kTokenFileMagic = "TITANTOK";
inline constexpr uint32_t kTokenFileVersion = 1;
inline constexpr size_t kTokenFileHeaderBytes = 32;

// True when bytes start with the token file magic.
bool is_token_file(std::string_view bytes);

class TokenFileReader {
 public:
  // Maps the file and validates the header and the document table; a bad header, a size that
  // does not match it or a broken table is a titan::Error naming the file and the offset. Shared:
  // the loader's carried tokens may refer to a file after the loader has moved past it.
  static std::shared_ptr<const TokenFileReader> open(const std::string& path);

  uint32_t vocab_size() const { return vocab_size_; }
  uint64_t n_tokens() const { return n_tokens_; }
  size_t n_docs() const { return doc_ends_.size(); }
  // Document i's length in tokens, from the table alone (no token is read).
  uint64_t doc_size(size_t i) const;
  // Appends document i's ids; an id >= vocab_size() is a titan::Error naming its byte offset.
  void read_doc(size_t i, std::vector<int32_t>& out) const;
  // Appends ids [begin, end) of document i (end <= doc_size(i)), checked as read_doc checks them.
  void read_tokens(size_t i, uint64_t begin, uint64_t end, std::vector<int32_t>& out) const;
  // Tokens read from the mapping so far (by any thread): what shows that a loader rank reads only
  // its own rows' tokens.
  uint64_t tokens_read() const { return tokens_read_.load(std::memory_order_relaxed); }
  const std::string& path() const { return file_.path(); }

 private:
  TokenFileReader() = default;

  MappedFile file_;
  uint32_t vocab_size_ = 0;
  uint64_t n_tokens_ = 0;
  std::vector<uint64_t> doc_ends_;
  mutable std::atomic<uint64_t> tokens_read_{0};
};

// Writes a token file through io/atomic_file: under a temporary name beside `path`, synced and
// renamed into place on commit(), so neither a failed run nor a crash leaves a partial file under
// the final name.
class TokenFileWriter {
 public:
  TokenFileWriter(std::string path, uint32_t vocab_size);
  // Removes the temporary file unless committed.
  TokenFileWriter(const TokenFileWriter&) = delete;
  TokenFileWriter& operator=(const TokenFileWriter&) = delete;

  // One document; every id must be in [0, vocab_size) (a titan::Error otherwise).
  void add_doc(const std::vector<int32_t>& ids);
  void commit();
  uint64_t n_tokens() const { return n_tokens_; }
  size_t n_docs() const { return doc_ends_.size(); }

 private:
  AtomicFile file_;
  uint32_t vocab_size_;
  uint64_t n_tokens_ = 0;
  std::vector<uint64_t> doc_ends_;
  bool committed_ = false;
};

}  // namespace titan
