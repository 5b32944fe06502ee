// CRC-32C against RFC 3720's check values (appendix B.4) and "123456789"'s, in one piece and
// extended piecewise, through the SSE4.2 path where the CPU has it and the table path.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "titan/io/crc32c.h"

namespace titan {
namespace {

uint32_t portable(const std::vector<unsigned char>& bytes) {
  return crc32c_final(crc32c_extend_portable(crc32c_init(), bytes.data(), bytes.size()));
}

TEST(Crc32c, Rfc3720CheckValues) {
  std::vector<unsigned char> zeros(32, 0x00), ones(32, 0xff), up(32), down(32);
  for (int i = 0; i < 32; ++i) {
    up[i] = static_cast<unsigned char>(i);
    down[i] = static_cast<unsigned char>(31 - i);
  }
  const std::string digits = "123456789";
  const std::vector<unsigned char> check(digits.begin(), digits.end());
  const std::pair<const std::vector<unsigned char>*, uint32_t> cases[] = {{&zeros, 0x8a9136aau},
                                                                          {&ones, 0x62a8ab43u},
                                                                          {&up, 0x46dd794eu},
                                                                          {&down, 0x113fdb5cu},
                                                                          {&check, 0xe3069283u}};
  for (const auto& [bytes, expected] : cases) {
    EXPECT_EQ(crc32c(bytes->data(), bytes->size()), expected);
    EXPECT_EQ(portable(*bytes), expected);
  }
  EXPECT_EQ(crc32c(nullptr, 0), 0u);
}

// Any split of the input gives the one-piece CRC (the word loop's tails of 1 to 7 bytes).
TEST(Crc32c, ExtendsPiecewise) {
  std::vector<unsigned char> bytes(61);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<unsigned char>(i * 37 + 11);
  const uint32_t whole = crc32c(bytes.data(), bytes.size());
  EXPECT_EQ(portable(bytes), whole);
  for (size_t cut = 0; cut <= bytes.size(); ++cut) {
    uint32_t crc = crc32c_extend(crc32c_init(), bytes.data(), cut);
    crc = crc32c_extend(crc, bytes.data() + cut, bytes.size() - cut);
    EXPECT_EQ(crc32c_final(crc), whole) << "cut at " << cut;
  }
}

}  // namespace
}  // namespace titan
