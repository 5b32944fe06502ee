// CRC-32C (Castagnoli, reflected polynomial 0x82f63b78), the checksum iSCSI (RFC 3720), ext4 and
// TFRecord files use: what training checkpoints record per file (io/file_checksum.h) and what
// frames every record of a TensorBoard event file (train/tensorboard.h).
#pragma once

#include <cstddef>
#include <cstdint>

namespace titan {

// The CRC-32C of `n` bytes at `data` (crc32c("123456789") = 0xe3069283).
uint32_t crc32c(const void* data, size_t n);

// Extends a running CRC over `n` more bytes: start from crc32c_init(), end with crc32c_final();
// crc32c(p, n) == crc32c_final(crc32c_extend(crc32c_init(), p, n)), in as many pieces as wanted.
constexpr uint32_t crc32c_init() {
  return 0xffffffffu;
}
uint32_t crc32c_extend(uint32_t crc, const void* data, size_t n);
constexpr uint32_t crc32c_final(uint32_t crc) {
  return crc ^ 0xffffffffu;
}

// crc32c_extend computed a byte at a time from a table: what runs where the CPU lacks SSE4.2's
// crc32 instruction (tests check that both agree).
uint32_t crc32c_extend_portable(uint32_t crc, const void* data, size_t n);

}  // namespace titan
