// GPT-2's byte-to-unicode table: each of the 256 byte values is shown as one printable code point,
// so byte-level BPE vocabularies are strings of these code points (space = U+0120 'Ġ').
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace titan {

// The code point that stands for byte b.
uint32_t byte_to_code_point(uint8_t b);

// The UTF-8 of byte_to_code_point(b) for every byte in raw.
std::string byte_level_encode(std::string_view raw);

// Inverse of byte_level_encode; false when token (valid UTF-8) has a code point outside the table.
bool byte_level_decode(std::string_view token, std::string& raw);

}  // namespace titan
