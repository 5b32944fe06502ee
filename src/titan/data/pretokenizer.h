// The Split pre-tokenizer of GPT-4-style byte-level BPE tokenizers, as a hand-written scanner
// equivalent to the regex (faster than a regex engine, and needs no lookahead support):
//   Qwen2/Qwen3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|
//                 ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   Llama-3:     the same with \p{N}{1,3} in place of \p{N}.
// Every character is matched by some alternative, so the pre-tokens tile the text.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace titan {

class PreTokenizer {
 public:
  // The scanner for a Split regex from tokenizer.json, or nullopt when it is not one we implement.
  static std::optional<PreTokenizer> from_regex(std::string_view regex);

  // End (exclusive byte offset) of the pre-token starting at pos < text.size(); text is valid
  // UTF-8.
  size_t next_end(std::string_view text, size_t pos) const;

 private:
  explicit PreTokenizer(int max_digits) : max_digits_(max_digits) {}
  int max_digits_;  // digits per number pre-token: 1 (Qwen2) or 3 (Llama-3)
};

}  // namespace titan
