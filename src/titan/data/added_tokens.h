// Finds added tokens (<|im_start|>, <think>, ...) in text: leftmost match first, the longest one
// when several start at the same place, as Hugging Face tokenizers' AddedVocabulary does.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace titan {

struct AddedToken {
  std::string content;
  int32_t id = -1;
  bool special = false;  // special tokens can be left unparsed (encode with parse_special off)
};

struct AddedMatch {
  size_t begin = 0, end = 0;  // byte offsets; begin == text.size() when there is no match
  int32_t id = -1;
};

class AddedTokenMatcher {
 public:
  AddedTokenMatcher() = default;
  explicit AddedTokenMatcher(std::vector<AddedToken> tokens);

  bool empty() const { return tokens_.empty(); }
  // The first match at or after pos; special tokens are skipped unless include_special.
  AddedMatch find(std::string_view text, size_t pos, bool include_special) const;

 private:
  std::vector<AddedToken> tokens_;  // longest first, so the first hit at a position is the longest
  std::array<bool, 256> first_byte_{};
};

}  // namespace titan
