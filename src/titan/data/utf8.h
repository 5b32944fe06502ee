// UTF-8 reading and repair shared by the tokenizer's encoder and decoder.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace titan {

// Length in bytes of the well-formed UTF-8 sequence starting at s[pos], or 0 when the bytes there
// are not one (bad lead byte, bad continuation, overlong form, surrogate, > U+10FFFF, truncated).
size_t utf8_valid_length(std::string_view s, size_t pos);

// True when every byte of s belongs to a well-formed UTF-8 sequence.
bool utf8_is_valid(std::string_view s);

// s with every ill-formed sequence replaced by U+FFFD, one per "maximal subpart" (Unicode 15
// §3.9), which is what Python's bytes.decode("utf-8", errors="replace") and Rust's
// String::from_utf8_lossy do; so our text matches what Hugging Face tokenizers sees and returns.
std::string utf8_replace_invalid(std::string_view s);

// Decodes the code point at s[pos], which must be well formed; *len receives its byte length.
inline uint32_t utf8_decode_valid(std::string_view s, size_t pos, size_t* len) {
  const auto b0 = static_cast<uint8_t>(s[pos]);
  if (b0 < 0x80) {
    *len = 1;
    return b0;
  }
  const auto cont = [&](size_t i) { return static_cast<uint32_t>(s[pos + i]) & 0x3F; };
  if (b0 < 0xE0) {
    *len = 2;
    return ((b0 & 0x1Fu) << 6) | cont(1);
  }
  if (b0 < 0xF0) {
    *len = 3;
    return ((b0 & 0x0Fu) << 12) | (cont(1) << 6) | cont(2);
  }
  *len = 4;
  return ((b0 & 0x07u) << 18) | (cont(1) << 12) | (cont(2) << 6) | cont(3);
}

// Appends the UTF-8 encoding of code point cp (< 0x110000, not a surrogate).
void utf8_append(std::string& out, uint32_t cp);

}  // namespace titan
