#include "titan/io/crc32c.h"

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

#include <array>
#include <cstring>

namespace titan {
namespace {

#if defined(__x86_64__)
// About 8 bytes per 3 cycles.
__attribute__((target("sse4.2"))) uint32_t crc32c_sse42(uint32_t crc, const unsigned char* p,
                                                        size_t n) {
  uint64_t c = crc;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t word;
    std::memcpy(&word, p + i, 8);
    c = _mm_crc32_u64(c, word);
  }
  auto c32 = static_cast<uint32_t>(c);
  for (; i < n; ++i) c32 = _mm_crc32_u8(c32, p[i]);
  return c32;
}
#endif

}  // namespace

uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n) {
  static const auto table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) != 0 ? (c >> 1) ^ 0x82f63b78u : c >> 1;
      t[i] = c;
    }
    return t;
  }();
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) crc = table[(crc ^ p[i]) & 0xff] ^ (crc >> 8);
  return crc;
}

uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  static const bool sse42 = __builtin_cpu_supports("sse4.2");
  if (sse42) return crc32c_sse42(crc, static_cast<const unsigned char*>(data), n);
#endif
  return crc32c_extend_portable(crc, data, n);
}

uint32_t crc32c(const void* data, size_t n) {
  return crc32c_final(crc32c_extend(crc32c_init(), data, n));
}

}  // namespace titan
