#include "titan/data/added_tokens.h"

#include <algorithm>

namespace titan {

AddedTokenMatcher::AddedTokenMatcher(std::vector<AddedToken> tokens) : tokens_(std::move(tokens)) {
  std::stable_sort(tokens_.begin(), tokens_.end(), [](const AddedToken& a, const AddedToken& b) {
    return a.content.size() > b.content.size();
  });
  for (const AddedToken& t : tokens_) first_byte_[static_cast<uint8_t>(t.content[0])] = true;
}

AddedMatch AddedTokenMatcher::find(std::string_view text, size_t pos, bool include_special) const {
  for (; pos < text.size(); ++pos) {
    if (!first_byte_[static_cast<uint8_t>(text[pos])]) continue;
    for (const AddedToken& t : tokens_) {
      if ((include_special || !t.special) && text.compare(pos, t.content.size(), t.content) == 0) {
        return {pos, pos + t.content.size(), t.id};
      }
    }
  }
  return {text.size(), text.size(), -1};
}

}  // namespace titan
