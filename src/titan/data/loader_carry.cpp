#include "titan/data/loader_carry.h"

#include <algorithm>

namespace titan {

void read_with_eos(const TokenFileReader& file, size_t doc, uint64_t begin, uint64_t end,
                   int32_t eos, std::vector<int32_t>& out) {
  const uint64_t tokens = file.doc_size(doc);
  file.read_tokens(doc, begin, std::min(end, tokens), out);
  if (end > tokens) out.push_back(eos);
}

CarriedTokens::CarriedTokens(std::vector<int32_t> ids) {
  append(ids.data(), ids.size());
}

void CarriedTokens::append(const int32_t* ids, size_t n) {
  if (n == 0) return;
  Piece p;
  p.ids.assign(ids, ids + n);
  size_ += n;
  pieces_.push_back(std::move(p));
}

void CarriedTokens::append_span(std::shared_ptr<const TokenFileReader> file, size_t doc,
                                uint64_t begin, uint64_t end, int32_t eos) {
  if (end == begin) return;
  Piece p;
  p.file = std::move(file);
  p.doc = doc;
  p.begin = begin;
  p.end = end;
  p.eos = eos;
  size_ += p.size();
  pieces_.push_back(std::move(p));
}

const DocumentTokens& UnreadDocument::tokens() const {
  std::call_once(made_, [this] { tokens_ = make_(); });
  return tokens_;
}

void CarriedTokens::append_document(std::shared_ptr<const UnreadDocument> document, uint64_t begin,
                                    uint64_t end) {
  if (end == begin) return;
  Piece p;
  p.document = std::move(document);
  p.begin = begin;
  p.end = end;
  size_ += p.size();
  pieces_.push_back(std::move(p));
}

void CarriedTokens::keep_last(size_t n) {
  while (size_ > n) {
    Piece& front = pieces_.front();
    const size_t drop = std::min(size_ - n, front.size());
    size_ -= drop;
    if (drop == front.size()) {
      pieces_.pop_front();
    } else if (front.span()) {
      front.begin += drop;
    } else {
      front.ids.erase(front.ids.begin(), front.ids.begin() + static_cast<std::ptrdiff_t>(drop));
    }
  }
}

std::vector<int32_t> CarriedTokens::read() const {
  std::vector<int32_t> out;
  out.reserve(size_);
  for (const Piece& p : pieces_) {
    if (p.file) {
      read_with_eos(*p.file, p.doc, p.begin, p.end, p.eos, out);
    } else if (p.document) {
      const std::vector<int32_t>& ids = p.document->tokens().ids;
      out.insert(out.end(), ids.begin() + static_cast<std::ptrdiff_t>(p.begin),
                 ids.begin() + static_cast<std::ptrdiff_t>(p.end));
    } else {
      out.insert(out.end(), p.ids.begin(), p.ids.end());
    }
  }
  return out;
}

LoaderState LoaderPosition::read() const {
  LoaderState s = state;
  if (unread_carry) s.carry = unread_carry->read();
  return s;
}

}  // namespace titan
