#include "titan/data/byte_level.h"

#include <unordered_map>

#include "titan/data/utf8.h"

namespace titan {
namespace {

// Printable bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') keep their code point; the other 68 get U+0100
// onwards in increasing byte order.
struct Table {
  std::array<uint32_t, 256> to_cp{};
  std::unordered_map<uint32_t, uint8_t> to_byte;
  Table() {
    uint32_t next = 0x100;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_cp[b] = printable ? b : next++;
      to_byte[to_cp[b]] = static_cast<uint8_t>(b);
    }
  }
};

const Table& table() {
  static const Table t;
  return t;
}

}  // namespace

uint32_t byte_to_code_point(uint8_t b) {
  return table().to_cp[b];
}

std::string byte_level_encode(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) utf8_append(out, table().to_cp[static_cast<uint8_t>(c)]);
  return out;
}

bool byte_level_decode(std::string_view token, std::string& raw) {
  raw.clear();
  size_t pos = 0;
  while (pos < token.size()) {
    size_t len = 0;
    const auto it = table().to_byte.find(utf8_decode_valid(token, pos, &len));
    if (it == table().to_byte.end()) return false;
    raw.push_back(static_cast<char>(it->second));
    pos += len;
  }
  return true;
}

}  // namespace titan
