#include "titan/io/byte_size.h"

#include <array>
#include <cctype>
#include <cstdio>
#include <limits>
#include <string>
#include <utility>

#include "titan/core/error.h"
#include "titan/io/json_util.h"

namespace titan {
namespace {

constexpr std::array<std::pair<std::string_view, uint64_t>, 10> kUnits = {{
    {"", 1},
    {"b", 1},
    {"kb", 1000ull},
    {"mb", 1000ull * 1000},
    {"gb", 1000ull * 1000 * 1000},
    {"tb", 1000ull * 1000 * 1000 * 1000},
    {"kib", 1ull << 10},
    {"mib", 1ull << 20},
    {"gib", 1ull << 30},
    {"tib", 1ull << 40},
}};

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

}  // namespace

uint64_t parse_byte_size(std::string_view text, std::string_view what) {
  const auto bad = [&]() {
    fail(what, " ", json_quote(text),
         " is not a size (a positive whole number of bytes, or with a unit: 500MB, 5GB, 2GiB)");
  };
  const std::string_view s = trim(text);
  size_t digits = 0;
  while (digits < s.size() && std::isdigit(static_cast<unsigned char>(s[digits]))) ++digits;
  if (digits == 0) bad();
  std::string unit(trim(s.substr(digits)));
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  uint64_t scale = 0;
  for (const auto& [name, factor] : kUnits) {
    if (unit == name) scale = factor;
  }
  if (scale == 0) bad();

  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  uint64_t n = 0;
  for (size_t i = 0; i < digits; ++i) {
    const auto d = static_cast<uint64_t>(s[i] - '0');
    if (n > (kMax - d) / 10) bad();
    n = n * 10 + d;
  }
  if (n == 0 || n > kMax / scale) bad();
  return n * scale;
}

std::string format_byte_size(uint64_t bytes) {
  static constexpr std::array<const char*, 6> kNames = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  auto value = static_cast<double>(bytes);
  size_t unit = 0;
  // 1023.9 KiB would print as "1024 KiB": step up once the rounded figure reaches 1024.
  while (unit + 1 < kNames.size() && value >= 1023.5) {
    value /= 1024.0;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof text,
                value < 9.995   ? "%.2f %s"
                : value < 99.95 ? "%.1f %s"
                                : "%.0f %s",
                value, kNames[unit]);
  return text;
}

}  // namespace titan
