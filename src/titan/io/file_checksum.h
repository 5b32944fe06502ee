// Checksums of whole files, for what titan writes and reads back later (training checkpoints):
// CRC-32C (Castagnoli, io/crc32c.h) over every byte, read in 4 MiB blocks.
#pragma once

#include <string>

namespace titan {

// "crc32c:xxxxxxxx" (8 lowercase hex digits) of the file at `path`; titan::Error naming the file
// when it cannot be read.
std::string file_checksum(const std::string& path);

// file_checksum, computed once per process for a file whose size and modification time have not
// changed since (a checkpoint is checked when a resume chooses it, then read to load it).
std::string file_checksum_cached(const std::string& path);

}  // namespace titan
