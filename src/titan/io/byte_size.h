// Sizes written the way Hugging Face's max_shard_size is ("5GB", "500MB", "2GiB") or as a plain
// number of bytes.
#pragma once

#include <cstdint>
#include <string_view>

namespace titan {

// A positive whole number with an optional unit, case-insensitive: B, KB/MB/GB/TB (powers of
// 1000, as HF reads them) or KiB/MiB/GiB/TiB (powers of 1024); spaces around the unit allowed.
// Anything else, zero or an overflow is a titan::Error naming `what` and the text.
uint64_t parse_byte_size(std::string_view text, std::string_view what);

}  // namespace titan
