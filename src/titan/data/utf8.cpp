#include "titan/data/utf8.h"

namespace titan {
namespace {

// Byte-length of the sequence a lead byte announces and the allowed range of its first
// continuation byte (Unicode Table 3-7); 0 = not a lead byte. The narrowed ranges exclude overlong
// forms (E0, F0), surrogates (ED) and code points above U+10FFFF (F4).
struct LeadInfo {
  uint8_t length, lo, hi;
};

LeadInfo lead_info(uint8_t b) {
  if (b < 0x80) return {1, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {2, 0x80, 0xBF};
  if (b == 0xE0) return {3, 0xA0, 0xBF};
  if (b == 0xED) return {3, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {3, 0x80, 0xBF};
  if (b == 0xF0) return {4, 0x90, 0xBF};
  if (b >= 0xF1 && b <= 0xF3) return {4, 0x80, 0xBF};
  if (b == 0xF4) return {4, 0x80, 0x8F};
  return {0, 0, 0};
}

// Bytes of the longest prefix at s[pos] that is a well-formed sequence or a prefix of one (the
// "maximal subpart"); complete says whether the whole sequence was present. At least 1 byte.
size_t maximal_subpart(std::string_view s, size_t pos, bool* complete) {
  const LeadInfo info = lead_info(static_cast<uint8_t>(s[pos]));
  *complete = info.length == 1;
  if (info.length <= 1) return 1;
  size_t n = 1;
  for (; n < info.length && pos + n < s.size(); ++n) {
    const auto b = static_cast<uint8_t>(s[pos + n]);
    const uint8_t lo = n == 1 ? info.lo : 0x80, hi = n == 1 ? info.hi : 0xBF;
    if (b < lo || b > hi) return n;
  }
  *complete = n == info.length;
  return n;
}

}  // namespace

size_t utf8_valid_length(std::string_view s, size_t pos) {
  bool complete = false;
  const size_t n = maximal_subpart(s, pos, &complete);
  return complete ? n : 0;
}

bool utf8_is_valid(std::string_view s) {
  size_t pos = 0;
  while (pos < s.size()) {
    // ASCII dominates real text; skip it eight bytes at a time.
    while (pos + 8 <= s.size()) {
      uint64_t word = 0;
      for (int i = 0; i < 8; ++i)
        word |= static_cast<uint64_t>(static_cast<uint8_t>(s[pos + i])) << (8 * i);
      if (word & 0x8080808080808080ull) break;
      pos += 8;
    }
    if (pos >= s.size()) break;
    const size_t n = utf8_valid_length(s, pos);
    if (n == 0) return false;
    pos += n;
  }
  return true;
}

std::string utf8_replace_invalid(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 8);
  size_t pos = 0;
  while (pos < s.size()) {
    bool complete = false;
    const size_t n = maximal_subpart(s, pos, &complete);
    if (complete) {
      out.append(s.substr(pos, n));
    } else {
      out.append("\xEF\xBF\xBD");
    }
    pos += n;
  }
  return out;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace titan
