#include "titan/data/tokenizer.h"

#include "titan/data/unicode.h"
#include "titan/data/utf8.h"

namespace titan {

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  std::string repaired;
  if (!utf8_is_valid(text)) {
    repaired = utf8_replace_invalid(text);
    text = repaired;
  }
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  size_t start = 0;
  while (start < text.size()) {
    const AddedMatch m = raw_added_.find(text, start, parse_special);
    encode_segment(text.substr(start, m.begin - start), parse_special, ids);
    if (m.id < 0) break;
    ids.push_back(m.id);
    start = m.end;
  }
  return ids;
}

std::vector<int32_t> Tokenizer::encode_with_special_tokens(std::string_view text,
                                                           bool parse_special) const {
  std::vector<int32_t> ids = special_prefix_;
  const std::vector<int32_t> body = encode(text, parse_special);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), special_suffix_.begin(), special_suffix_.end());
  return ids;
}

void Tokenizer::encode_segment(std::string_view text, bool parse_special,
                               std::vector<int32_t>& ids) const {
  if (text.empty()) return;
  std::string normalized;
  if (nfc_ && nfc_normalize(text, normalized)) text = normalized;
  size_t start = 0;
  while (start < text.size()) {
    const AddedMatch m = normalized_added_.empty()
                             ? AddedMatch{text.size(), text.size(), -1}
                             : normalized_added_.find(text, start, parse_special);
    encode_normalized(text.substr(start, m.begin - start), ids);
    if (m.id < 0) break;
    ids.push_back(m.id);
    start = m.end;
  }
}

void Tokenizer::encode_normalized(std::string_view text, std::vector<int32_t>& ids) const {
  for (size_t pos = 0; pos < text.size();) {
    const size_t end = pre_tokenizer_->next_end(text, pos);
    bpe_.encode_word(text.substr(pos, end - pos), ids);
    pos = end;
  }
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string raw;
  for (const int32_t id : ids) {
    if (id < 0 || static_cast<size_t>(id) >= tokens_.size() || tokens_[id].empty()) continue;
    if (skip_special && special_[id]) continue;
    raw += decoded_[id];
  }
  return utf8_is_valid(raw) ? raw : utf8_replace_invalid(raw);
}

int32_t Tokenizer::token_to_id(std::string_view token) const {
  const auto it = token_ids_.find(token);
  return it == token_ids_.end() ? -1 : it->second;
}

std::string Tokenizer::id_to_token(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < tokens_.size() ? tokens_[id] : std::string();
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < special_.size() && special_[id];
}

}  // namespace titan
