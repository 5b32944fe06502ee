// Inputs built to crash a parser or exhaust memory, for the regression tests of the CLI's bad-input
// handling. Each is written as text: building them with nlohmann::json would recurse as deep as
// they nest.
#pragma once

#include <zlib.h>

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace titan::test {

// A tokenizer normalizer that is a Sequence holding a Sequence ... `depth` times, NFC innermost.
inline std::string nested_sequence_normalizer(size_t depth) {
  std::string s;
  s.reserve(depth * 40);
  for (size_t i = 0; i < depth; ++i) s += "{\"type\":\"Sequence\",\"normalizers\":[";
  s += "{\"type\":\"NFC\"}";
  for (size_t i = 0; i < depth; ++i) s += "]}";
  return s;
}

// The text of tokenizer.json `text` (an object with a "normalizer" key written as by
// nlohmann's dump) with its normalizer replaced by `normalizer`.
inline std::string with_normalizer(const std::string& text, const std::string& normalizer) {
  const size_t key = text.find("\"normalizer\"");
  EXPECT_NE(key, std::string::npos);
  const size_t colon = text.find(':', key);
  // The old value ends before the key that follows it at the top level: "pre_tokenizer".
  const size_t next = text.find("\"pre_tokenizer\"", colon);
  EXPECT_NE(next, std::string::npos);
  const size_t comma = text.rfind(',', next);
  return text.substr(0, colon + 1) + normalizer + text.substr(comma);
}

// One JSON Lines record whose "ids" list holds, after a valid id, an element nested `depth` deep.
inline std::string deeply_nested_ids_record(size_t depth) {
  return "{\"ids\": [1, " + std::string(depth, '[') + "0" + std::string(depth, ']') + "]}\n";
}

// A gzip file that decompresses to `n_mib` MiB of JSON Lines, one 4 KiB record per line mostly
// padding: a bomb when n_mib is large, as deflate packs runs of one byte about a thousandfold.
inline void write_gzip_bomb(const std::string& path, size_t n_mib) {
  gzFile f = gzopen(path.c_str(), "wb9");
  ASSERT_NE(f, nullptr) << path;
  const std::string record = "{\"text\": \"a\"}";
  const std::string line = record + std::string(4096 - record.size() - 1, ' ') + "\n";
  std::string mib;
  for (int i = 0; i < 256; ++i) mib += line;
  for (size_t i = 0; i < n_mib; ++i) {
    ASSERT_EQ(gzwrite(f, mib.data(), static_cast<unsigned>(mib.size())),
              static_cast<int>(mib.size()));
  }
  ASSERT_EQ(gzclose(f), Z_OK);
}

}  // namespace titan::test
