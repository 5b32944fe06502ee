#include "titan/data/pretokenizer.h"

#include "titan/data/unicode.h"
#include "titan/data/utf8.h"

namespace titan {
namespace {

constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

CharClass class_at(std::string_view s, size_t pos, size_t* len) {
  return char_class(utf8_decode_valid(s, pos, len));
}

// End of the run of class k starting at pos.
size_t skip_class(std::string_view s, size_t pos, CharClass k) {
  while (pos < s.size()) {
    size_t len = 0;
    if (class_at(s, pos, &len) != k) break;
    pos += len;
  }
  return pos;
}

// Bytes after the apostrophe matched by (?i:s|t|re|ve|m|ll|d), 0 if none. Oniguruma's case
// folding also lets U+017F LATIN SMALL LETTER LONG S stand for 's'.
size_t contraction_length(std::string_view s, size_t pos) {
  const auto lower = [&](size_t i) {
    return i < s.size() ? static_cast<char>(s[i] | (s[i] >= 'A' && s[i] <= 'Z' ? 0x20 : 0)) : '\0';
  };
  switch (lower(pos)) {
    case 's':
    case 't':
    case 'm':
    case 'd':
      return 1;
    case 'r':
    case 'v':
      return lower(pos + 1) == 'e' ? 2 : 0;
    case 'l':
      return lower(pos + 1) == 'l' ? 2 : 0;
    default:
      return s.substr(pos, 2) == "\xC5\xBF" ? 2 : 0;
  }
}

}  // namespace

std::optional<PreTokenizer> PreTokenizer::from_regex(std::string_view regex) {
  if (regex == kQwen2Regex) return PreTokenizer(1);
  if (regex == kLlama3Regex) return PreTokenizer(3);
  return std::nullopt;
}

size_t PreTokenizer::next_end(std::string_view s, size_t pos) const {
  size_t len0 = 0;
  const uint32_t c0 = utf8_decode_valid(s, pos, &len0);
  const CharClass k0 = char_class(c0);
  const size_t p1 = pos + len0;
  size_t len1 = 0;
  const CharClass k1 = p1 < s.size() ? class_at(s, p1, &len1) : CharClass::whitespace;

  // (?i:'s|'t|'re|'ve|'m|'ll|'d)
  if (c0 == '\'') {
    const size_t n = contraction_length(s, p1);
    if (n > 0) return p1 + n;
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (k0 == CharClass::letter) return skip_class(s, p1, CharClass::letter);
  if (c0 != '\r' && c0 != '\n' && k0 != CharClass::number && p1 < s.size() &&
      k1 == CharClass::letter) {
    return skip_class(s, p1, CharClass::letter);
  }
  // \p{N} or \p{N}{1,3}
  if (k0 == CharClass::number) {
    size_t end = p1;
    for (int n = 1; n < max_digits_ && end < s.size(); ++n) {
      size_t len = 0;
      if (class_at(s, end, &len) != CharClass::number) break;
      end += len;
    }
    return end;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  if (k0 == CharClass::other || (c0 == ' ' && p1 < s.size() && k1 == CharClass::other)) {
    size_t end = skip_class(s, p1, CharClass::other);
    while (end < s.size() && (s[end] == '\r' || s[end] == '\n')) ++end;
    return end;
  }
  // Whitespace. \s*[\r\n]+ takes the run up to its last line break; failing that, \s+(?!\S) takes
  // the run but leaves its last character to the word that follows; failing that, \s+.
  size_t end = pos, last_start = pos, after_break = 0;
  while (end < s.size()) {
    size_t len = 0;
    const uint32_t cp = utf8_decode_valid(s, end, &len);
    if (char_class(cp) != CharClass::whitespace) break;
    last_start = end;
    end += len;
    if (cp == '\r' || cp == '\n') after_break = end;
  }
  if (after_break > 0) return after_break;
  if (end == s.size() || last_start == pos) return end;
  return last_start;
}

}  // namespace titan
