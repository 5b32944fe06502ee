#include "titan/io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "titan/core/error.h"

namespace titan {
namespace {

constexpr size_t kWritebackBytes = 64 << 20;

// Distinct temporary names for concurrent writers in one process (threads) and across processes.
std::string temp_name_for(const std::string& path) {
  static std::atomic<unsigned> counter{0};
  const std::filesystem::path p(path);
  // Appended piece by piece: GCC 12 warns falsely (-Wrestrict) on a chain of operator+.
  std::string name = ".";
  name += p.filename().string();
  name += ".tmp-";
  name += std::to_string(::getpid());
  name += '-';
  name += std::to_string(counter++);
  return (p.parent_path() / name).string();
}

void fsync_directory_of(const std::string& path) {
  std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (dir.empty()) dir = ".";
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  TITAN_CHECK(fd >= 0, path,
              ": cannot open its directory to sync the rename: ", std::strerror(errno));
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  TITAN_CHECK(rc == 0, path, ": cannot sync its directory: ", std::strerror(err));
}

}  // namespace

AtomicFile::AtomicFile(std::string path)
    : path_(std::move(path)), temp_path_(temp_name_for(path_)) {
  fd_ = ::open(temp_path_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  TITAN_CHECK(fd_ >= 0, path_, ": cannot create temporary file ", temp_path_, ": ",
              std::strerror(errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temp_path_.c_str());
}

void AtomicFile::reserve(size_t bytes) {
  if (bytes == 0) return;
  // KEEP_SIZE: the file's length still grows only by what is written. A file system without
  // fallocate just loses the speed-up; only a full disk is worth stopping for.
  if (::fallocate(fd_, FALLOC_FL_KEEP_SIZE, 0, static_cast<off_t>(bytes)) != 0) {
    TITAN_CHECK(errno != ENOSPC, path_, ": not enough disk space for ", bytes, " bytes");
  }
}

void AtomicFile::write(const void* data, size_t bytes) {
  TITAN_CHECK(fd_ >= 0, path_, ": write after commit");
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::write(fd_, p, bytes);
    if (n < 0 && errno == EINTR) continue;
    TITAN_CHECK(n > 0, path_, ": write failed: ", n < 0 ? std::strerror(errno) : "no progress");
    p += n;
    bytes -= static_cast<size_t>(n);
    written_ += static_cast<size_t>(n);
  }
  // Start writing back what is complete, so the fsync in commit() finds little left to do and
  // the disk works while the caller produces the rest. Advice only: errors surface at fsync.
  if (written_ - flushed_ >= kWritebackBytes) {
    (void)::sync_file_range(fd_, static_cast<off_t>(flushed_),
                            static_cast<off_t>(written_ - flushed_), SYNC_FILE_RANGE_WRITE);
    flushed_ = written_;
  }
}

void AtomicFile::write_at(size_t offset, const void* data, size_t bytes) {
  TITAN_CHECK(fd_ >= 0, path_, ": write after commit");
  TITAN_CHECK(offset <= written_ && bytes <= written_ - offset, path_, ": overwriting bytes [",
              offset, ", ", offset + bytes, ") past the ", written_, " written");
  const auto* p = static_cast<const unsigned char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    TITAN_CHECK(n > 0, path_, ": write failed: ", n < 0 ? std::strerror(errno) : "no progress");
    p += n;
    bytes -= static_cast<size_t>(n);
    offset += static_cast<size_t>(n);
  }
}

void AtomicFile::commit() {
  TITAN_CHECK(fd_ >= 0, path_, ": committed twice");
  TITAN_CHECK(::fsync(fd_) == 0, path_, ": fsync failed: ", std::strerror(errno));
  const int rc = ::close(fd_);
  fd_ = -1;
  TITAN_CHECK(rc == 0, path_, ": close failed: ", std::strerror(errno));
  TITAN_CHECK(::rename(temp_path_.c_str(), path_.c_str()) == 0, path_, ": cannot rename ",
              temp_path_, " into place: ", std::strerror(errno));
  committed_ = true;
  fsync_directory_of(path_);
}

void write_file_atomic(const std::string& path, std::string_view content) {
  AtomicFile file(path);
  file.write(content.data(), content.size());
  file.commit();
}

}  // namespace titan
