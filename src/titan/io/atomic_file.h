// Files that appear complete or not at all: written under a temporary name in the destination
// directory, flushed to disk, then renamed into place. A crash or an error mid-write leaves the
// previous file (or none) and no partial one.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace titan {

class AtomicFile {
 public:
  // Creates the temporary file beside `path`; throws titan::Error naming `path` on failure.
  explicit AtomicFile(std::string path);
  // Removes the temporary file unless commit() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Reserves disk space for `bytes` up front: fewer, larger extents (faster writes) and an early
  // error when the disk is full, instead of one midway.
  void reserve(size_t bytes);
  void write(const void* data, size_t bytes);
  // Overwrites `bytes` at `offset`, inside what write() has written: a header whose counts are
  // known only at the end.
  void write_at(size_t offset, const void* data, size_t bytes);
  // fsync, rename onto `path`, fsync the directory so the rename itself is durable.
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
  size_t written_ = 0;  // bytes written so far
  size_t flushed_ = 0;  // bytes whose writeback has been started
};

// `content` to `path`, atomically.
void write_file_atomic(const std::string& path, std::string_view content);

}  // namespace titan
