// Generated ids -> text as it becomes final, for streaming: only complete UTF-8 characters are
// released, and text that could still grow into a stop string is held back until it cannot.
// When a stop string appears the text ends just before it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "titan/data/tokenizer.h"

namespace titan {

class TextStream {
 public:
  // Special tokens (eos, <|im_end|>) are not shown; added non-special ones (<think>) are.
  TextStream(const Tokenizer& tokenizer, std::vector<std::string> stop);
  // Adds one generated id; returns the text newly released (often empty).
  std::string push(int32_t id);
  // The end of generation: everything still held, incomplete characters as U+FFFD.
  std::string finish();
  bool stopped() const { return stopped_; }
  // Everything released so far.
  const std::string& text() const { return text_; }

 private:
  std::string release(size_t n);

  const Tokenizer& tokenizer_;
  std::vector<std::string> stop_;
  std::vector<int32_t> pending_;  // ids whose bytes do not yet end on a character boundary
  std::string held_;              // decoded, not yet released
  std::string text_;
  bool stopped_ = false;
};

}  // namespace titan
