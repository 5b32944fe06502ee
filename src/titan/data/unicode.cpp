#include "titan/data/unicode.h"

#include <utf8proc.h>

#include <bitset>
#include <cstdlib>
#include <memory>

#include "titan/core/error.h"
#include "titan/data/utf8.h"

namespace titan {
namespace {

constexpr uint32_t kMaxCodePoint = 0x110000;

bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

// Code points that NFC leaves alone whatever surrounds them: combining class 0, NFC maps them to
// themselves, and they can neither compose with a preceding starter nor start with one that can.
// A string made only of these is already NFC (the quick check); anything else goes to utf8proc.
class NfcStable {
 public:
  NfcStable() {
    std::bitset<kMaxCodePoint>& second = *second_;
    // Every non-initial code point of a canonical decomposition may compose with what precedes it.
    for (uint32_t cp = 0x80; cp < kMaxCodePoint; ++cp) {
      const utf8proc_property_t* p = utf8proc_get_property(static_cast<utf8proc_int32_t>(cp));
      if (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0) continue;
      utf8proc_int32_t parts[8];
      int last = 0;
      const auto n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(cp), parts, 8,
                                             UTF8PROC_DECOMPOSE, &last);
      for (utf8proc_ssize_t i = 1; i < n && i < 8; ++i) second.set(static_cast<uint32_t>(parts[i]));
    }
    // Hangul vowel and trailing jamo compose algorithmically with a preceding syllable or jamo.
    for (uint32_t cp = 0x1161; cp <= 0x1175; ++cp) second.set(cp);
    for (uint32_t cp = 0x11A8; cp <= 0x11C2; ++cp) second.set(cp);
    for (uint32_t cp = 0x80; cp < kMaxCodePoint; ++cp) stable_->set(cp, is_stable(cp, second));
    for (uint32_t cp = 0; cp < 0x80; ++cp) stable_->set(cp);
  }
  bool operator()(uint32_t cp) const { return stable_->test(cp); }

 private:
  static bool is_stable(uint32_t cp, const std::bitset<kMaxCodePoint>& second) {
    if (second.test(cp)) return false;
    const auto c = static_cast<utf8proc_int32_t>(cp);
    const utf8proc_property_t* p = utf8proc_get_property(c);
    if (p->combining_class != 0) return false;
    if (p->decomp_seqindex == UINT16_MAX || p->decomp_type != 0) return true;
    utf8proc_int32_t parts[8];
    int last = 0;
    const auto n = utf8proc_decompose_char(c, parts, 8, UTF8PROC_DECOMPOSE, &last);
    if (n < 1 || n > 8 || second.test(static_cast<uint32_t>(parts[0]))) return false;
    // A composition exclusion or singleton decomposition does not come back to itself under NFC.
    std::string one;
    utf8_append(one, cp);
    utf8proc_uint8_t* nfc = utf8proc_NFC(reinterpret_cast<const utf8proc_uint8_t*>(one.c_str()));
    const bool same = nfc != nullptr && one == reinterpret_cast<const char*>(nfc);
    std::free(nfc);
    return same;
  }

  std::unique_ptr<std::bitset<kMaxCodePoint>> second_ =
      std::make_unique<std::bitset<kMaxCodePoint>>();
  std::unique_ptr<std::bitset<kMaxCodePoint>> stable_ =
      std::make_unique<std::bitset<kMaxCodePoint>>();
};

}  // namespace

CharClass char_class_slow(uint32_t cp) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(cp))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return CharClass::letter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return CharClass::number;
    default:
      return is_white_space(cp) ? CharClass::whitespace : CharClass::other;
  }
}

bool nfc_normalize(std::string_view s, std::string& out) {
  static const NfcStable stable;
  size_t pos = 0;
  bool needed = false;
  while (pos < s.size()) {
    if (static_cast<uint8_t>(s[pos]) < 0x80) {
      ++pos;
      continue;
    }
    size_t len = 0;
    const uint32_t cp = utf8_decode_valid(s, pos, &len);
    if (!stable(cp)) {
      needed = true;
      break;
    }
    pos += len;
  }
  if (!needed) return false;
  utf8proc_uint8_t* mapped = nullptr;
  const utf8proc_ssize_t n = utf8proc_map(
      reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
      &mapped, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  TITAN_CHECK(n >= 0, "NFC normalisation failed: ", utf8proc_errmsg(n));
  out.assign(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
  std::free(mapped);
  return true;
}

}  // namespace titan
