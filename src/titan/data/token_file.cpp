#include "titan/data/token_file.h"

#include <bit>
#include <cstring>

#include "titan/core/error.h"

namespace titan {

static_assert(std::endian::native == std::endian::little, "token files are little-endian");

namespace {

template <typename T>
T load(const unsigned char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

bool is_token_file(std::string_view bytes) {
  return bytes.substr(0, kTokenFileMagic.size()) == kTokenFileMagic;
}

std::shared_ptr<const TokenFileReader> TokenFileReader::open(const std::string& path) {
  // Built in place: the token counter is an atomic, which does not move.
  std::shared_ptr<TokenFileReader> shared(new TokenFileReader());
  TokenFileReader& r = *shared;
  r.file_ = MappedFile::open(path);
  const unsigned char* p = r.file_.data();
  const size_t size = r.file_.size();
  TITAN_CHECK(size >= kTokenFileHeaderBytes &&
                  is_token_file({reinterpret_cast<const char*>(p), kTokenFileMagic.size()}),
              path, ": not a token file (no \"TITANTOK\" header at offset 0)");
  const auto version = load<uint32_t>(p + 8);
  TITAN_CHECK(version == kTokenFileVersion, path, ": token file version ", version,
              " at offset 8 is not supported (only ", kTokenFileVersion, ")");
  r.vocab_size_ = load<uint32_t>(p + 12);
  TITAN_CHECK(r.vocab_size_ > 0 && r.vocab_size_ <= uint32_t{INT32_MAX}, path, ": vocab_size ",
              r.vocab_size_, " at offset 12 is out of range");
  r.n_tokens_ = load<uint64_t>(p + 16);
  const auto n_docs = load<uint64_t>(p + 24);
  // Compare in a way that cannot overflow: counts first, then the exact size.
  const uint64_t payload = size - kTokenFileHeaderBytes;
  TITAN_CHECK(r.n_tokens_ <= payload / 4 && n_docs <= payload / 8 &&
                  4 * r.n_tokens_ + 8 * n_docs == payload,
              path, ": header says ", r.n_tokens_, " tokens and ", n_docs,
              " documents (offsets 16, 24), which needs ",
              "32 + 4 * n_tokens + 8 * n_docs bytes, but the file has ", size);
  const size_t table = kTokenFileHeaderBytes + 4 * r.n_tokens_;
  r.doc_ends_.resize(n_docs);
  uint64_t previous = 0;
  for (size_t i = 0; i < n_docs; ++i) {
    const auto end = load<uint64_t>(p + table + 8 * i);
    TITAN_CHECK(end >= previous && end <= r.n_tokens_, path, ": document table entry ", i,
                " at offset ", table + 8 * i, " is ", end, ", outside [", previous, ", ",
                r.n_tokens_, "]");
    r.doc_ends_[i] = previous = end;
  }
  TITAN_CHECK(previous == r.n_tokens_, path, ": the document table ends at token ", previous,
              " but the file holds ", r.n_tokens_, " tokens");
  return shared;
}

uint64_t TokenFileReader::doc_size(size_t i) const {
  return doc_ends_[i] - (i == 0 ? 0 : doc_ends_[i - 1]);
}

void TokenFileReader::read_doc(size_t i, std::vector<int32_t>& out) const {
  read_tokens(i, 0, doc_size(i), out);
}

void TokenFileReader::read_tokens(size_t i, uint64_t begin, uint64_t end,
                                  std::vector<int32_t>& out) const {
  TITAN_CHECK(begin <= end && end <= doc_size(i), path(), ": tokens [", begin, ", ", end,
              ") are outside document ", i, " of ", doc_size(i), " tokens");
  if (end == begin) return;  // nothing to copy (memcpy must not get out's null data())
  const uint64_t first_token = (i == 0 ? 0 : doc_ends_[i - 1]) + begin;
  const uint64_t n = end - begin;
  const unsigned char* p = file_.data() + kTokenFileHeaderBytes;
  const size_t first = out.size();
  out.resize(first + n);
  std::memcpy(out.data() + first, p + 4 * first_token, 4 * n);
  tokens_read_.fetch_add(n, std::memory_order_relaxed);
  for (uint64_t t = 0; t < n; ++t) {
    const auto id = static_cast<uint32_t>(out[first + t]);
    TITAN_CHECK(id < vocab_size_, path(), ": token id ", id, " at offset ",
                kTokenFileHeaderBytes + 4 * (first_token + t), " is outside the vocabulary [0, ",
                vocab_size_, ")");
  }
}

TokenFileWriter::TokenFileWriter(std::string path, uint32_t vocab_size)
    : file_(std::move(path)), vocab_size_(vocab_size) {
  TITAN_CHECK(vocab_size > 0 && vocab_size <= uint32_t{INT32_MAX}, file_.path(), ": vocab_size ",
              vocab_size, " is out of range");
  // The header is written last, when the counts are known; zeros hold its place.
  const char zeros[kTokenFileHeaderBytes] = {};
  file_.write(zeros, sizeof(zeros));
}

void TokenFileWriter::add_doc(const std::vector<int32_t>& ids) {
  TITAN_CHECK(!committed_, file_.path(), ": add_doc after commit");
  for (const int32_t id : ids) {
    TITAN_CHECK(id >= 0 && static_cast<uint32_t>(id) < vocab_size_, file_.path(), ": document ",
                doc_ends_.size(), " has id ", id, ", outside the vocabulary [0, ", vocab_size_,
                ")");
  }
  file_.write(ids.data(), 4 * ids.size());
  n_tokens_ += ids.size();
  doc_ends_.push_back(n_tokens_);
}

void TokenFileWriter::commit() {
  file_.write(doc_ends_.data(), 8 * doc_ends_.size());
  unsigned char header[kTokenFileHeaderBytes] = {};
  std::memcpy(header, kTokenFileMagic.data(), kTokenFileMagic.size());
  const uint64_t n_docs = doc_ends_.size();
  std::memcpy(header + 8, &kTokenFileVersion, 4);
  std::memcpy(header + 12, &vocab_size_, 4);
  std::memcpy(header + 16, &n_tokens_, 8);
  std::memcpy(header + 24, &n_docs, 8);
  file_.write_at(0, header, sizeof(header));
  file_.commit();
  committed_ = true;
}

}  // namespace titan
