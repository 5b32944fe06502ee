// Sizes written the way Hugging Face's max_shard_size is ("5GB", "500MB", "2GiB") or as a plain
// number of bytes, and byte counts written for people ("37.4 MiB").
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace titan {

// A positive whole number with an optional unit, case-insensitive: B, KB/MB/GB/TB (powers of
// 1000, as HF reads them) or KiB/MiB/GiB/TiB (powers of 1024); spaces around the unit allowed.
// Anything else, zero or an overflow is a titan::Error naming `what` and the text.
uint64_t parse_byte_size(std::string_view text, std::string_view what);
// `bytes` in the largest binary unit it reaches (B, KiB, MiB, GiB, TiB, PiB), at least three
// significant digits: "812 B", "1.50 KiB", "37.4 MiB", "213 GiB", "1023 B".
std::string format_byte_size(uint64_t bytes);

}  // namespace titan
