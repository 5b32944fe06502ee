// Reading dataset files: the sorted file list a set of paths, directories and glob patterns
// names, and a file's bytes, gunzipped when it is gzip-compressed.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace titan {

// Each spec is a file, a directory (every regular file below it, hidden names skipped) or a glob
// pattern (*, ?, [...]). Returns the files sorted by path, so the order never depends on the file
// system. A spec that names nothing, or a file reached twice, is a titan::Error.
std::vector<std::string> expand_data_paths(const std::vector<std::string>& specs);

// What a dataset file's first bytes say it is when it is a binary format titan does not read as
// data -- Parquet, Arrow (file or stream), safetensors, zip, tar, bzip2, xz, zstd, 7-Zip, NumPy,
// HDF5, SQLite, ELF -- with how to turn it into JSON Lines (commands naming `path`); "" for
// anything else (text, JSON, gzip, titan's token files).
std::string binary_data_kind(std::string_view bytes, const std::string& path);

// The whole file, refused when binary_data_kind names it (also after gunzipping); a gzip file (by
// its magic bytes, any name) is decompressed, concatenated members included, up to gunzip_limit()
// bytes. A truncated or corrupt stream, a file past the limit and running out of memory are each a
// titan::Error naming the file (and, for a broken stream, the compressed byte offset where it
// broke).
std::string read_data_file(const std::string& path);

// A dataset file is held in memory whole, so what one gzip file may decompress to is capped: a
// few compressed megabytes can claim terabytes. The default is well above common shards (c4's
// decompress to under 1 GiB) and well below a training host's memory; the variable raises or
// lowers it ("64GiB", "500MB", a number of bytes).
inline constexpr uint64_t kDefaultGunzipLimit = uint64_t{4} << 30;
inline constexpr const char* kGunzipLimitVariable = "TITAN_GUNZIP_LIMIT";
uint64_t gunzip_limit();

// The gunzipped bytes of `compressed` (one or more gzip members), inflated a piece at a time; more
// than `max_bytes` of output is an Error. `name` is for messages.
std::string gunzip(std::string_view compressed, const std::string& name, uint64_t max_bytes);

inline bool is_gzip(std::string_view bytes) {
  return bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x1f &&
         static_cast<unsigned char>(bytes[1]) == 0x8b;
}

// The file name without a trailing ".gz", lower-cased extension included ("a/b.JSONL.gz" ->
// "b.jsonl"): what decides how the decompressed bytes are read.
std::string data_file_kind_name(const std::string& path);

}  // namespace titan
