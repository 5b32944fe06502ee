// A whole file mapped read-only into memory: tensor data is read in place, never copied.
#pragma once

#include <cstddef>
#include <string>

namespace titan {

class MappedFile {
 public:
  MappedFile() = default;
  // Throws titan::Error naming `path` when it cannot be opened, is not a regular file or cannot
  // be mapped. An empty file maps to data() == nullptr, size() == 0.
  static MappedFile open(const std::string& path);
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const unsigned char* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Hint that [offset, offset + length) will be read soon (readahead when not cached).
  void advise_willneed(size_t offset, size_t length) const;

 private:
  void unmap();

  std::string path_;
  const unsigned char* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace titan
