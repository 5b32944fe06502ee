#include "titan/io/file_checksum.h"

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <tuple>
#include <vector>

#include "titan/core/error.h"
#include "titan/io/crc32c.h"

namespace titan {

std::string file_checksum(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  TITAN_CHECK(in.good(), path, ": cannot read it to check its checksum: ", std::strerror(errno));
  std::vector<char> block(size_t{4} << 20);
  uint32_t crc = crc32c_init();
  while (in) {
    in.read(block.data(), static_cast<std::streamsize>(block.size()));
    const auto got = static_cast<size_t>(in.gcount());
    crc = crc32c_extend(crc, block.data(), got);
  }
  TITAN_CHECK(in.eof(), path, ": read error while checking its checksum");
  char text[16];
  std::snprintf(text, sizeof(text), "%08x", crc32c_final(crc));
  return std::string("crc32c:") + text;
}

std::string file_checksum_cached(const std::string& path) {
  static std::mutex mutex;
  // Keyed by path, with the size and modification time the checksum was computed at.
  static std::map<std::string, std::tuple<uintmax_t, std::filesystem::file_time_type, std::string>>
      known;
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  const auto mtime = std::filesystem::last_write_time(path, ec);
  if (ec) return file_checksum(path);  // says why it cannot be read
  {
    const std::lock_guard<std::mutex> lock(mutex);
    const auto it = known.find(path);
    if (it != known.end() && std::get<0>(it->second) == size && std::get<1>(it->second) == mtime) {
      return std::get<2>(it->second);
    }
  }
  const std::string sum = file_checksum(path);
  const std::lock_guard<std::mutex> lock(mutex);
  known[path] = {size, mtime, sum};
  return sum;
}

}  // namespace titan
