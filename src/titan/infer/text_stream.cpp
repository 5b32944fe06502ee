#include "titan/infer/text_stream.h"

#include <algorithm>

#include "titan/core/error.h"

namespace titan {
namespace {

// A token's bytes can end inside a character; decode then shows U+FFFD at the end.
bool ends_with_replacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, "\xEF\xBF\xBD") == 0;
}

// A UTF-8 character is at most 4 bytes, each token at least one: past this many pending ids the
// replacement character is real (invalid bytes), not a character still being completed.
constexpr size_t kMaxPendingIds = 4;

}  // namespace

TextStream::TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop)
    : tokenizer_(tokenizer), stop_(std::move(stop)) {
  for (const std::string& s : stop_) TITAN_CHECK(!s.empty(), "a stop string must not be empty");
}

std::string TextStream::release(size_t n) {
  std::string out = held_.substr(0, n);
  held_.erase(0, n);
  text_ += out;
  return out;
}

std::string TextStream::push(int32_t id) {
  if (stopped_) return {};
  pending_.push_back(id);
  const std::string piece = tokenizer_.decode(pending_, /*skip_special=*/true);
  if (ends_with_replacement(piece) && pending_.size() < kMaxPendingIds) return {};
  pending_.clear();
  held_ += piece;
  // A stop string starts inside held_: everything before held_ was released only when no suffix
  // of it could begin one.
  size_t cut = std::string::npos;
  for (const std::string& s : stop_) cut = std::min(cut, held_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = release(cut);
    held_.clear();
    return out;
  }
  size_t keep = 0;  // longest suffix of held_ that is a proper prefix of a stop string
  for (const std::string& s : stop_) {
    for (size_t len = std::min(s.size() - 1, held_.size()); len > keep; --len) {
      if (held_.compare(held_.size() - len, len, s, 0, len) == 0) {
        keep = len;
        break;
      }
    }
  }
  return release(held_.size() - keep);
}

std::string TextStream::finish() {
  if (stopped_) return {};
  if (!pending_.empty()) held_ += tokenizer_.decode(pending_, /*skip_special=*/true);
  pending_.clear();
  return release(held_.size());
}

}  // namespace titan
