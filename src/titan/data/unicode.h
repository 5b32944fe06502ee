// The Unicode facts the tokenizer needs: the pre-tokenizer's character classes (\p{L}, \p{N},
// \s as Oniguruma defines them) and NFC normalisation (utf8proc).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace titan {

enum class CharClass : uint8_t {
  letter,      // \p{L}: Lu Ll Lt Lm Lo
  number,      // \p{N}: Nd Nl No
  whitespace,  // \s: the Unicode White_Space property
  other,       // everything else (punctuation, symbols, marks, controls, unassigned)
};

CharClass char_class_slow(uint32_t cp);

inline CharClass char_class(uint32_t cp) {
  // ASCII dominates; its classes are fixed, so a table avoids the utf8proc lookup.
  static constexpr auto ascii = [] {
    struct Table {
      CharClass c[128];
    } t{};
    for (uint32_t i = 0; i < 128; ++i) {
      t.c[i] = CharClass::other;
      if ((i >= 'a' && i <= 'z') || (i >= 'A' && i <= 'Z')) t.c[i] = CharClass::letter;
      if (i >= '0' && i <= '9') t.c[i] = CharClass::number;
      if ((i >= 0x09 && i <= 0x0D) || i == 0x20) t.c[i] = CharClass::whitespace;
    }
    return t;
  }();
  return cp < 128 ? ascii.c[cp] : char_class_slow(cp);
}

// Unicode NFC of s, which must be valid UTF-8. Returns false and leaves out untouched when s is
// already in NFC by a quick check, so callers can keep using s without a copy.
bool nfc_normalize(std::string_view s, std::string& out);

}  // namespace titan
